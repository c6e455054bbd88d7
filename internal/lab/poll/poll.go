// Package poll is the emulated cluster's one way of waiting for a
// condition: every 250 ms until it holds, it fails, the context ends or
// the timeout passes.
package poll

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// ErrTimeout is what Until returns, wrapped, when the timeout passed.
var ErrTimeout = errors.New("timed out")

// Until polls cond, first at once, then every 250 ms, until it returns
// true (nil), an error (that error), ctx ends (its error) or timeout
// passes (ErrTimeout, saying after how long).
func Until(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, cond)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w after %v", ErrTimeout, timeout)
	}
	return err
}
