package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestWebhookUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--resource-prefix=Bad"}, `--resource-prefix: resource prefix "Bad"`},
		{[]string{"extra"}, `webhook takes no positional arguments, got ["extra"]`},
		{[]string{"--device-list-strategy=cdi"}, `--device-list-strategy "cdi": want one of [envvar cdi-cri volume-mounts]`},
		{[]string{"--unprefixed-env-from=sometimes"}, `--unprefixed-env-from "sometimes": want one of [auto allow refuse]`},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"webhook"}, tt.args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tt.args, code, errOut.String(), tt.want)
		}
	}
}

func TestSchedulerHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"scheduler", "--help"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String()+errOut.String(), "--config") {
		t.Errorf("scheduler --help does not list kube-scheduler's --config flag")
	}
}
