package placement

import (
	"strings"
	"testing"
)

// TestEveryReasonKindHasText: every kind has its entry in the one table
// of reason texts (a name for the metrics, unique; the scheduler's short
// text) and its own words in Reason.String, so a new kind cannot reach
// the scheduler's events or `kubectl tessera why` unnamed.
func TestEveryReasonKindHasText(t *testing.T) {
	names := map[string]ReasonKind{}
	for k := Fits + 1; k < numReasonKinds; k++ {
		text := k.Text()
		if text.Name == "" || strings.HasPrefix(text.Name, "Unknown(") || text.Short == "" {
			t.Errorf("reason kind %d has no entry in reasonTexts: %+v", k, text)
			continue
		}
		if other, dup := names[text.Name]; dup {
			t.Errorf("reason kinds %d and %d are both named %s", other, k, text.Name)
		}
		names[text.Name] = k
		if got := (Reason{Kind: k}).String(); got == text.Name {
			t.Errorf("reason kind %s has no words of its own in Reason.summary (it says %q)", text.Name, got)
		}
	}
	if got := ReasonKind(numReasonKinds).Text(); !strings.HasPrefix(got.Name, "Unknown(") || !strings.HasPrefix(got.Short, "GPU request does not fit: Unknown(") {
		t.Errorf("a kind outside the table: %+v, want it named by its number", got)
	}
}
