# hack/nonfree.sh - sourced by the scripts that fetch NVIDIA's binaries from
# Debian 12's contrib/non-free components (limiter/test/fetch_nonfree.sh,
# hack/fetch-mps-control.sh).

# nonfree_download DIR PKG... - downloads the packages' .debs into DIR,
# first adding contrib/non-free to apt's sources if apt does not see the
# first package there (root).
nonfree_download() {
    dir=$1; shift
    if ! apt-cache policy "$1" 2>/dev/null | grep -q 'non-free'; then
        . /etc/os-release
        cat >/etc/apt/sources.list.d/tessera-nonfree.sources <<EOS
Types: deb
URIs: http://deb.debian.org/debian
Suites: ${VERSION_CODENAME} ${VERSION_CODENAME}-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOS
        apt-get update -q >/dev/null
    fi
    chmod 777 "$dir" # apt's sandbox user writes there
    (cd "$dir" && apt-get download -q "$@" >/dev/null 2>&1) || (cd "$dir" && apt-get download "$@")
}
