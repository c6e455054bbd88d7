package labdir

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// LogLine matches a line of a component's log (Log), which the lab's
// components write in klog's text format, `"message" logger="name"
// key="value" …`: the message msg with the string values kv (key, value,
// key, value, …) in that order, on one line. Other pairs may come between
// them (the logger's name, keys not asked for), so a check does not break
// when a logger is named or a key is added.
func LogLine(msg string, kv ...string) *regexp.Regexp {
	if len(kv)%2 != 0 {
		panic(fmt.Sprintf("labdir.LogLine(%q): %d values for key/value pairs, want an even number", msg, len(kv)))
	}
	var b strings.Builder
	b.WriteString(regexp.QuoteMeta(strconv.Quote(msg)))
	for i := 0; i < len(kv); i += 2 {
		b.WriteString(`[^\n]* `)
		b.WriteString(regexp.QuoteMeta(kv[i] + "=" + strconv.Quote(kv[i+1])))
	}
	return regexp.MustCompile(b.String())
}
