#!/usr/bin/env bash
# make test-release-plugin: the user's install of kubectl-tessera without
# cloning, tested: hack/release-plugin.sh writes the archive of this
# machine's platform and the krew manifest, krew (pinned in hack/krew)
# installs the plugin from them into an empty KREW_ROOT, and the installed
# binary runs. A tampered archive must be refused (its SHA-256 is in the
# manifest).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=$(go env GOOS)/$(go env GOARCH)
a=kubectl-tessera_$(go env GOOS)_$(go env GOARCH).tar.gz
fail() { echo "release-plugin test: $*" >&2; exit 1; }

RELEASE_PLATFORMS=$plat RELEASE_OUT=$work/release hack/release-plugin.sh
(cd hack/krew && CGO_ENABLED=0 GOWORK=off go build -o "$work/krew" sigs.k8s.io/krew/cmd/krew)

export KREW_ROOT=$work/krew-root
"$work/krew" install --manifest="$work/release/tessera.yaml" --archive="$work/release/$a" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "krew install failed"; }
[ -x "$KREW_ROOT/bin/kubectl-tessera" ] || fail "krew installed no $KREW_ROOT/bin/kubectl-tessera"
help=$("$KREW_ROOT/bin/kubectl-tessera" --help) || fail "the installed kubectl-tessera --help failed"
case $help in *"Tessera's view of the cluster's GPUs"*nodes*pods*why*) ;; *) fail "the installed plugin's help: $help" ;; esac
[ -f "$KREW_ROOT/receipts/tessera.yaml" ] || fail "krew kept no receipt of the install"

# The manifest pins the archive: another archive is refused.
cp "$work/release/$a" "$work/tampered.tar.gz"
printf 'x' >>"$work/tampered.tar.gz"
export KREW_ROOT=$work/krew-root-2
if "$work/krew" install --manifest="$work/release/tessera.yaml" --archive="$work/tampered.tar.gz" >"$work/tampered.log" 2>&1; then
  fail "krew installed an archive whose SHA-256 is not the manifest's"
fi
grep -q "checksum does not match" "$work/tampered.log" || { cat "$work/tampered.log" >&2; fail "the refusal does not say the checksum does not match"; }
echo "release-plugin test: krew $(cd hack/krew && GOWORK=off go list -m -f '{{.Version}}' sigs.k8s.io/krew) installed kubectl-tessera ($plat) from the manifest and archive; a tampered archive was refused"
