// Package poll is the one wait helper of Tessera's tests: Until polls a
// condition until it holds or a timeout passes. It imports nothing but the
// standard library, so unit-test packages use it without linking the
// control plane of package testenv (which re-exports it as
// testenv.WaitFor). Shipped code does not use it.
//
// Until waits for something to happen. A test that must show that
// something did NOT happen does not wait a while and look: it waits for a
// positive condition that the absence implies (an event recorded after
// the one that must not be there, a counter that moves only once the
// step in question is over, an informer synced past the change) and then
// checks.
package poll

import (
	"testing"
	"time"
)

// Until polls cond until it holds, failing the test (t.Fatalf, naming
// what) when timeout passes first. It polls at 10 ms, backing off to
// 250 ms, so a quick condition is seen at once and a slow one that reads
// the API server does not load it. Conditions that only read the API
// server may also use client-go's wait package.
func Until(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(wait)
	}
}
