//go:build !integration

package nodeagent

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	fakeMPS()
	os.Exit(m.Run())
}
