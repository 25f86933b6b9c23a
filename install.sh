#!/bin/sh
# Installs kelp and runs it as a service:
#
#   curl -sfL https://github.com/kelp-dev/kelp/releases/latest/download/install.sh | sh -
#   curl -sfL … | sh -s - server --cluster-init
#   curl -sfL … | KELP_URL=https://server:6443 KELP_TOKEN=… sh -   # a token of `kelp token create`
#
# Arguments after `sh -s -` are the service's command (`server …` or
# `agent …`). Settings (INSTALL_KELP_* and KELP_* in the environment) are
# described in README.md, "Installing as a service". Re-running it
# upgrades in place; with no arguments and no KELP_* settings it keeps
# the installed service's command and settings.
#
# POSIX sh: runs under dash and busybox ash as well as bash.
set -eu

GITHUB_RELEASES=https://github.com/kelp-dev/kelp/releases
SYSTEMD_DIR=/etc/systemd/system
INITD_DIR=/etc/init.d
CONFIG_DIR=/etc/kelp
DEFAULT_DATA_DIR=/var/lib/kelp
LINKS="kubectl crictl ctr etcdctl"

info() { printf 'kelp install: %s\n' "$*"; }
fatal() {
    printf 'kelp install: error: %s\n' "$*" >&2
    exit 1
}
is_true() { [ "${1:-}" = true ]; }

# quote prints $1 in single quotes, for a shell or an environment file
# (systemd's EnvironmentFile parser reads 'a'\''b' as a shell does).
quote() {
    printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"
}

# sd_quote prints $1 quoted for a systemd ExecStart line: backslash and
# quote escaped, % and $ doubled so systemd expands neither.
sd_quote() {
    printf "'%s'" "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e "s/'/\\\\'/g" -e 's/%/%%/g' -e 's/\$/$$/g')"
}

# as_root runs a command as root: directly, or through sudo.
as_root() {
    if [ -n "$SUDO" ]; then sudo "$@"; else "$@"; fi
}

# durable PATH... flushes the files or directories to disk, so a power
# cut after it keeps them: sync with arguments fsyncs just those
# (coreutils, busybox); a sync without them flushes everything.
durable() {
    as_root sync "$@" 2>/dev/null || as_root sync
}

# write_file PATH MODE writes stdin to PATH through a temporary file in
# the same directory, so PATH is whole or as it was, also after a power
# cut: the file is on disk before its rename, the rename after it.
write_file() {
    _tmp="$1.kelp-install.$$"
    # shellcheck disable=SC2016 # expanded by the inner shell
    as_root sh -c 'umask 077 && cat >"$1"' sh "$_tmp" || {
        as_root rm -f "$_tmp"
        fatal "cannot write $1"
    }
    as_root chmod "$2" "$_tmp"
    durable "$_tmp"
    as_root mv -f "$_tmp" "$1"
    durable "$(dirname "$1")"
}

setup_root() {
    SUDO=
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 ||
            fatal "install.sh must run as root (it installs a service and kelp manages the machine's network): run it with sudo, e.g. curl -sfL … | sudo sh -"
        SUDO=sudo
    fi
}

setup_arch() {
    _m=$(uname -m)
    case $_m in
        x86_64 | amd64) ARCH=amd64 ;;
        aarch64 | arm64) ARCH=arm64 ;;
        *) fatal "unsupported architecture $_m: kelp is built for amd64 (x86_64) and arm64 (aarch64)" ;;
    esac
}

# writable says whether root can write to DIR (a read-only mount cannot).
writable() {
    # shellcheck disable=SC2016 # expanded by the inner shell
    as_root sh -c 'touch "$1" && rm -f "$1"' sh "$1/.kelp-install-test.$$" 2>/dev/null
}

# setup_bin_dir picks where kelp goes: INSTALL_KELP_BIN_DIR, or
# /usr/local/bin, or /opt/bin where /usr/local is read-only (Fedora
# CoreOS, Flatcar).
setup_bin_dir() {
    if [ -n "${INSTALL_KELP_BIN_DIR:-}" ]; then
        BIN_DIR=$INSTALL_KELP_BIN_DIR
        case $BIN_DIR in /*) ;; *) fatal "INSTALL_KELP_BIN_DIR must be an absolute path, not $BIN_DIR" ;; esac
        as_root mkdir -p "$BIN_DIR" || fatal "cannot create $BIN_DIR"
    else
        BIN_DIR=/usr/local/bin
        if ! as_root mkdir -p "$BIN_DIR" 2>/dev/null || ! writable "$BIN_DIR"; then
            info "$BIN_DIR is read-only: installing to /opt/bin"
            BIN_DIR=/opt/bin
            as_root mkdir -p "$BIN_DIR" || fatal "cannot create $BIN_DIR"
        fi
    fi
    writable "$BIN_DIR" || fatal "$BIN_DIR is not writable: set INSTALL_KELP_BIN_DIR to a directory that is"
}

# setup_service_manager sets MANAGER to systemd (running as init),
# openrc, or none.
setup_service_manager() {
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        MANAGER=systemd
    elif command -v openrc-run >/dev/null 2>&1 && command -v rc-update >/dev/null 2>&1 &&
        command -v rc-service >/dev/null 2>&1; then
        MANAGER=openrc
        OPENRC_RUN=$(command -v openrc-run)
    else
        MANAGER=none
    fi
}

service_file() { # SERVICE
    case $MANAGER in
        systemd) echo "$SYSTEMD_DIR/$1.service" ;;
        openrc) echo "$INITD_DIR/$1" ;;
        *) echo "" ;;
    esac
}

env_file() { # SERVICE
    case $MANAGER in
        systemd) echo "$SYSTEMD_DIR/$1.service.env" ;;
        *) echo "$CONFIG_DIR/$1.env" ;;
    esac
}

# env_names lists the variables that go into the env file: KELP_*, and the
# proxy settings kelp's containerd and image pulls need.
env_names() {
    env | sed -n 's/^\(KELP_[A-Za-z0-9_]*\)=.*/\1/p'
    for _n in HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
        eval "_set=\${$_n+x}"
        [ -z "$_set" ] || echo "$_n"
    done
}

# secret_env NAME names the environment variable of a flag whose value is
# a secret or carries one (a datastore URL with a password): such values
# go into the env file (mode 0600), not into the unit file.
secret_env() {
    case $1 in
        --token | -t) echo KELP_TOKEN ;;
        --agent-token) echo KELP_AGENT_TOKEN ;;
        --datastore-endpoint) echo KELP_DATASTORE_ENDPOINT ;;
        --snapshot-s3-secret-key) echo KELP_SNAPSHOT_S3_SECRET_KEY ;;
        --snapshot-s3-access-key) echo KELP_SNAPSHOT_S3_ACCESS_KEY ;;
        *) echo "" ;;
    esac
}

# parse_command turns INSTALL_KELP_EXEC and the arguments into ROLE
# (server or agent), the service's arguments quoted for systemd (SD_ARGS)
# and for a shell (SH_ARGS), the env file's lines (ENV_LINES) and the
# data dir (DATA_DIR).
parse_command() {
    ROLE=
    SD_ARGS=
    SH_ARGS=
    ENV_LINES=
    SECRET_LINES=
    DATA_DIR=
    _has_server=
    _has_token=
    for _n in $(env_names); do
        _v=
        eval "_v=\${$_n}"
        ENV_LINES="$ENV_LINES$_n=$(quote "$_v")
"
    done
    [ -z "${KELP_DATA_DIR:-}" ] || DATA_DIR=$KELP_DATA_DIR
    [ -z "${KELP_URL:-}" ] || _has_server=1
    [ -z "${KELP_TOKEN:-}${KELP_TOKEN_FILE:-}${KELP_AGENT_TOKEN:-}" ] || _has_token=1

    # shellcheck disable=SC2086 # INSTALL_KELP_EXEC is split into words on purpose
    set -- ${INSTALL_KELP_EXEC:-} "$@"
    case ${1:-} in
        server | agent)
            ROLE=$1
            shift
            ;;
        "" | -*)
            if [ -n "${KELP_URL:-}" ]; then
                [ -n "$_has_token" ] || fatal "KELP_URL is set, so this is an agent: it needs KELP_TOKEN too: on the server, \`kelp token create\` makes one that joins agents only"
                ROLE=agent
            else
                ROLE=server
            fi
            ;;
        *) fatal "unknown command $1: the service runs 'server …' or 'agent …'" ;;
    esac

    _pending=
    _data_next=
    for _a in "$@"; do
        case $_a in *'
'*) fatal "arguments with newlines are not supported: $_a" ;; esac
        if [ -n "$_pending" ]; then
            SECRET_LINES="$SECRET_LINES$_pending=$(quote "$_a")
"
            _pending=
            continue
        fi
        if [ -n "$_data_next" ]; then
            DATA_DIR=$_a
            _data_next=
        else
            case $_a in
                --*=* | -t=*)
                    _env=$(secret_env "${_a%%=*}")
                    if [ -n "$_env" ]; then
                        SECRET_LINES="$SECRET_LINES$_env=$(quote "${_a#*=}")
"
                        [ "$_env" != KELP_TOKEN ] && [ "$_env" != KELP_AGENT_TOKEN ] || _has_token=1
                        continue
                    fi
                    case $_a in
                        --data-dir=* | -d=*) DATA_DIR=${_a#*=} ;;
                        --server=* | -s=*) _has_server=1 ;;
                        --token-file=*) _has_token=1 ;;
                    esac
                    ;;
                *)
                    _env=$(secret_env "$_a")
                    if [ -n "$_env" ]; then
                        _pending=$_env
                        [ "$_env" != KELP_TOKEN ] && [ "$_env" != KELP_AGENT_TOKEN ] || _has_token=1
                        continue
                    fi
                    case $_a in
                        --data-dir | -d) _data_next=1 ;;
                        --server | -s) _has_server=1 ;;
                        --token-file) _has_token=1 ;;
                    esac
                    ;;
            esac
        fi
        SD_ARGS="$SD_ARGS $(sd_quote "$_a")"
        SH_ARGS="$SH_ARGS $(quote "$_a")"
    done
    [ -z "$_pending" ] || fatal "the last flag needs a value"
    [ -z "$_data_next" ] || fatal "--data-dir needs a value"
    ENV_LINES="$ENV_LINES$SECRET_LINES"

    if [ "$ROLE" = agent ]; then
        [ -n "$_has_server" ] || fatal "an agent needs the server to join: pass --server https://<server>:6443 or set KELP_URL"
        [ -n "$_has_token" ] || fatal "an agent needs a join token: on the server, \`kelp token create\` makes one that joins agents only; pass it with --token-file or KELP_TOKEN"
    fi
    if [ -z "$DATA_DIR" ] && [ -f "$CONFIG_DIR/config.yaml" ]; then
        DATA_DIR=$(sed -n 's/^data-dir:[[:space:]]*["'\'']\{0,1\}\([^"'\'' #]*\).*/\1/p' "$CONFIG_DIR/config.yaml" | tail -n 1)
    fi
    [ -n "$DATA_DIR" ] || DATA_DIR=$DEFAULT_DATA_DIR
    check_data_dir "$DATA_DIR"
}

# check_data_dir refuses a data dir the uninstaller could not remove
# safely: it must be absolute and at least two levels deep.
check_data_dir() {
    case $1 in
        /*/*[!/]*) ;;
        *) fatal "data dir $1: use an absolute path at least two levels deep, like /var/lib/kelp (the uninstaller removes it)" ;;
    esac
}

# keep_existing_service says whether this run upgrades the binary only:
# no command and no KELP_* settings were given and a service exists, so
# its command and settings stay as they are. It sets ROLE and DATA_DIR.
keep_existing_service() {
    [ "$#" -eq 0 ] && [ -z "${INSTALL_KELP_EXEC:-}" ] || return 1
    [ -z "$(env | sed -n '/^KELP_[A-Za-z0-9_]*=/p')" ] || return 1
    [ "$MANAGER" != none ] || return 1
    for _r in server agent; do
        _svc=kelp
        [ $_r = server ] || _svc=kelp-agent
        [ -f "$(service_file $_svc)" ] || continue
        ROLE=$_r
        DATA_DIR=$DEFAULT_DATA_DIR
        _uninstall=$BIN_DIR/$_svc-uninstall.sh
        if [ -f "$_uninstall" ]; then
            _line=$(sed -n '/^DATA_DIR=/p' "$_uninstall" | head -n 1)
            [ -z "$_line" ] || eval "$_line"
        fi
        check_data_dir "$DATA_DIR"
        return 0
    done
    return 1
}

setup_downloader() {
    if command -v curl >/dev/null 2>&1; then
        DOWNLOADER=curl
    elif command -v wget >/dev/null 2>&1; then
        DOWNLOADER=wget
    else
        fatal "neither curl nor wget is installed: install one of them, or download kelp yourself and run install.sh with INSTALL_KELP_BINARY=/path/to/kelp"
    fi
    command -v sha256sum >/dev/null 2>&1 || command -v shasum >/dev/null 2>&1 ||
        fatal "neither sha256sum nor shasum is installed: one of them checks the download"
}

# https_only sets CURL_PROTO and WGET_PROTO, the options that keep the
# downloads, redirects included, on https, and refuses a plain http URL,
# unless INSTALL_KELP_ALLOW_HTTP=true: anyone on the path could swap a
# binary fetched over http, and its checksum with it.
https_only() {
    CURL_PROTO=
    WGET_PROTO=
    is_true "${INSTALL_KELP_ALLOW_HTTP:-}" && return 0
    for _url in "$@"; do
        case $_url in
            https://*) ;;
            *) fatal "$_url is not an https URL: kelp is downloaded over https only (set INSTALL_KELP_ALLOW_HTTP=true for a mirror you trust on a network you trust)" ;;
        esac
    done
    CURL_PROTO="--proto =https --proto-redir =https"
    # busybox's wget has no --https-only: the URLs were checked above, but
    # a redirect to http is followed.
    if [ "$DOWNLOADER" = wget ] && wget --help 2>&1 | grep -q -- --https-only; then
        WGET_PROTO=--https-only
    fi
}

# download URL FILE fetches URL into FILE, three tries.
download() {
    _try=1
    while :; do
        # shellcheck disable=SC2086 # CURL_PROTO and WGET_PROTO are lists of options
        case $DOWNLOADER in
            curl) as_root curl $CURL_PROTO -fsSL --connect-timeout 20 -o "$2" "$1" && return 0 ;;
            wget) as_root wget $WGET_PROTO -q -O "$2" "$1" && return 0 ;;
        esac
        [ "$_try" -lt 3 ] || return 1
        info "download of $1 failed; trying again"
        _try=$((_try + 1))
        sleep 2
    done
}

# resolve_version sets VERSION from INSTALL_KELP_VERSION, or from where
# the channel's URL redirects to (GitHub's releases/latest redirects to
# releases/tag/<version>).
resolve_version() {
    if [ -n "${INSTALL_KELP_VERSION:-}" ]; then
        VERSION=$INSTALL_KELP_VERSION
    else
        _channel=${INSTALL_KELP_CHANNEL:-stable}
        [ "$_channel" != stable ] || _channel=latest
        _url=${INSTALL_KELP_CHANNEL_URL:-${RELEASE_URL%/download}}/$_channel
        https_only "$_url"
        # shellcheck disable=SC2086 # CURL_PROTO and WGET_PROTO are lists of options
        case $DOWNLOADER in
            curl) _where=$(curl $CURL_PROTO -fsSL --connect-timeout 20 -o /dev/null -w '%{url_effective}' "$_url") || _where= ;;
            wget) _where=$(wget $WGET_PROTO -S -O /dev/null "$_url" 2>&1 | tr -d '\r' | sed -n 's/^ *[Ll]ocation: *//p' | tail -n 1) ;;
        esac
        _where=${_where%/}
        VERSION=${_where##*/}
        if [ -z "$_where" ] || [ "$VERSION" = "$_channel" ]; then
            fatal "cannot find the version of channel ${INSTALL_KELP_CHANNEL:-stable} at $_url: set INSTALL_KELP_VERSION"
        fi
    fi
    case $VERSION in
        *[!A-Za-z0-9._+-]* | "") fatal "not a version: $VERSION" ;;
    esac
}

sha256() { # FILE
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d ' ' -f 1
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -d ' ' -f 1
    else
        fatal "neither sha256sum nor shasum is installed: they check the download"
    fi
}

# expected_sha256 NAME prints NAME's checksum from the release's list.
expected_sha256() {
    awk -v f="$1" '$2 == f || $2 == "*" f { print $1; exit }' "$TMP_DIR/sha256sums.txt"
}

verify() { # FILE NAME
    _want=$(expected_sha256 "$2")
    [ -n "$_want" ] || fatal "$2 is not listed in sha256sums.txt of $VERSION: nothing was installed"
    _got=$(sha256 "$1")
    [ "$_got" = "$_want" ] ||
        fatal "checksum mismatch for $2 of $VERSION: got $_got, sha256sums.txt says $_want. Nothing was installed; try again, or check INSTALL_KELP_URL"
}

# check_public_key fails early, before anything is downloaded, unless
# the signature that INSTALL_KELP_PUBLIC_KEY asks for can be checked.
check_public_key() {
    _key=${INSTALL_KELP_PUBLIC_KEY:-}
    [ -n "$_key" ] || return 0
    command -v openssl >/dev/null 2>&1 ||
        fatal "INSTALL_KELP_PUBLIC_KEY is set, but openssl, which checks the release's signature with it, is not installed: install it (apt-get install openssl, apk add openssl), or unset INSTALL_KELP_PUBLIC_KEY to rely on https and the checksums alone"
    { [ -f "$_key" ] && [ -r "$_key" ]; } ||
        fatal "INSTALL_KELP_PUBLIC_KEY $_key is not a readable file: give the path of the release's Ed25519 public key (PEM)"
    openssl pkeyutl -help 2>&1 | grep -q -- -rawin ||
        fatal "$(openssl version) cannot check Ed25519 signatures (openssl pkeyutl -rawin needs OpenSSL 3.0 or later): upgrade it, or unset INSTALL_KELP_PUBLIC_KEY"
    openssl pkey -pubin -in "$_key" -noout -text 2>/dev/null | grep -q ED25519 ||
        fatal "INSTALL_KELP_PUBLIC_KEY $_key is not an Ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----)"
}

# check_signature checks the release's sha256sums.txt against its Ed25519
# signature, sha256sums.txt.sig, when INSTALL_KELP_PUBLIC_KEY names the
# key: https and the checksums alone trust whoever serves the release.
check_signature() { # BASE_URL
    _key=${INSTALL_KELP_PUBLIC_KEY:-}
    [ -n "$_key" ] || return 0
    download "$1/sha256sums.txt.sig" "$TMP_DIR/sha256sums.txt.sig" ||
        fatal "cannot download $1/sha256sums.txt.sig, the signature INSTALL_KELP_PUBLIC_KEY asks to check: nothing was installed (is $VERSION signed?)"
    as_root openssl pkeyutl -verify -pubin -inkey "$_key" -rawin -in "$TMP_DIR/sha256sums.txt" \
        -sigfile "$TMP_DIR/sha256sums.txt.sig" >/dev/null 2>&1 ||
        fatal "the signature of sha256sums.txt of $VERSION does not match the key $_key: nothing was installed. Either the release was not signed with that key, or what $1 serves is not the release"
    info "sha256sums.txt of $VERSION is signed with $_key"
}

# download_kelp fetches the release binary for ARCH into NEW_BIN,
# compressed with what the host can decompress, and checks it against the
# release's sha256sums.txt (signed, with INSTALL_KELP_PUBLIC_KEY).
download_kelp() {
    RELEASE_URL=${INSTALL_KELP_URL:-$GITHUB_RELEASES/download}
    RELEASE_URL=${RELEASE_URL%/}
    setup_downloader
    https_only "$RELEASE_URL"
    check_public_key
    resolve_version
    _base=$RELEASE_URL/$VERSION
    _name=kelp-linux-$ARCH
    info "downloading kelp $VERSION for $ARCH from $_base"
    download "$_base/sha256sums.txt" "$TMP_DIR/sha256sums.txt" || fatal "cannot download $_base/sha256sums.txt"
    check_signature "$_base"
    if command -v zstd >/dev/null 2>&1; then
        _ext=.zst _unpack="zstd -dcq"
    elif command -v xz >/dev/null 2>&1; then
        _ext=.xz _unpack="xz -dc"
    elif command -v unxz >/dev/null 2>&1; then
        _ext=.xz _unpack="unxz -c"
    else
        _ext='' _unpack=''
    fi
    download "$_base/$_name$_ext" "$TMP_DIR/$_name$_ext" || fatal "cannot download $_base/$_name$_ext"
    verify "$TMP_DIR/$_name$_ext" "$_name$_ext"
    if [ -n "$_ext" ]; then
        # shellcheck disable=SC2016 # expanded by the inner shell
        as_root sh -c "$_unpack"' <"$1" >"$2"' sh "$TMP_DIR/$_name$_ext" "$NEW_BIN" ||
            fatal "cannot decompress $_name$_ext"
        as_root rm -f "$TMP_DIR/$_name$_ext"
        # The list names the uncompressed binary too: check what runs.
        [ -z "$(expected_sha256 "$_name")" ] || verify "$NEW_BIN" "$_name"
    else
        as_root mv -f "$TMP_DIR/$_name" "$NEW_BIN"
    fi
}

# check_kelp BINARY fails unless BINARY is a kelp: `kelp --version` starts
# with a line "kelp <version> …".
check_kelp() {
    _line=$("$1" --version 2>/dev/null | head -n 1) || _line=
    case $_line in
        "kelp "*) KELP_VERSION_LINE=$_line ;;
        *) fatal "$2 is not a kelp binary (its --version printed \"$_line\"): nothing was installed" ;;
    esac
}

# get_binary puts the kelp to install at NEW_BIN, or sets NEW_BIN empty
# when the installed binary stays (INSTALL_KELP_SKIP_DOWNLOAD).
get_binary() {
    NEW_BIN=$TMP_DIR/kelp
    if is_true "${INSTALL_KELP_SKIP_DOWNLOAD:-}"; then
        [ -x "$BIN_DIR/kelp" ] || fatal "INSTALL_KELP_SKIP_DOWNLOAD=true, but there is no kelp binary at $BIN_DIR/kelp: put it there first"
        NEW_BIN=
        check_kelp "$BIN_DIR/kelp" "$BIN_DIR/kelp"
        info "using the kelp already installed at $BIN_DIR/kelp"
        return
    fi
    if [ -n "${INSTALL_KELP_BINARY:-}" ]; then
        [ -f "$INSTALL_KELP_BINARY" ] || fatal "INSTALL_KELP_BINARY=$INSTALL_KELP_BINARY: no such file"
        as_root cp "$INSTALL_KELP_BINARY" "$NEW_BIN" || fatal "cannot copy $INSTALL_KELP_BINARY to $BIN_DIR"
        _from=$INSTALL_KELP_BINARY
    else
        download_kelp
        _from="the release binary"
    fi
    as_root chmod 0755 "$NEW_BIN"
    check_kelp "$NEW_BIN" "$_from"
}

# run_check_config runs `kelp check-config` with the binary about to be
# installed; a FAIL stops the install before anything is in place.
run_check_config() {
    if is_true "${INSTALL_KELP_SKIP_CHECK:-}"; then
        info "skipping kelp check-config (INSTALL_KELP_SKIP_CHECK=true)"
        return
    fi
    _bin=${NEW_BIN:-$BIN_DIR/kelp}
    if _report=$(as_root "$_bin" check-config 2>&1); then
        return
    fi
    printf '%s\n' "$_report" >&2
    fatal "kelp check-config found a problem that keeps kelp from running (above). Fix it and run install.sh again, or set INSTALL_KELP_SKIP_CHECK=true to install anyway. Nothing was installed"
}

# install_binary moves NEW_BIN into place with one rename: a running kelp
# keeps its old file, and no one ever sees half a binary, not even after
# a power cut (NEW_BIN is on disk before the rename). The old binary
# stays as kelp.previous.
install_binary() {
    [ -n "$NEW_BIN" ] || return 0
    if [ -f "$BIN_DIR/kelp" ]; then
        if [ "$(sha256 "$BIN_DIR/kelp")" = "$(sha256 "$NEW_BIN")" ]; then
            info "$BIN_DIR/kelp is already this kelp ($KELP_VERSION_LINE)"
            return
        fi
        as_root ln -f "$BIN_DIR/kelp" "$TMP_DIR/kelp.previous" || as_root cp -p "$BIN_DIR/kelp" "$TMP_DIR/kelp.previous"
        as_root mv -f "$TMP_DIR/kelp.previous" "$BIN_DIR/kelp.previous"
        info "the previous binary is kept as $BIN_DIR/kelp.previous"
    fi
    durable "$NEW_BIN"
    as_root mv -f "$NEW_BIN" "$BIN_DIR/kelp"
    durable "$BIN_DIR"
    info "installed $BIN_DIR/kelp ($KELP_VERSION_LINE)"
}

# install_links makes kubectl, crictl, ctr and etcdctl links to kelp,
# except where such a command exists already (INSTALL_KELP_SYMLINK=force
# replaces it, =skip makes none).
install_links() {
    case ${INSTALL_KELP_SYMLINK:-} in
        skip) return ;;
        "" | force) ;;
        *) fatal "INSTALL_KELP_SYMLINK is 'force' or 'skip', not ${INSTALL_KELP_SYMLINK}" ;;
    esac
    for _cmd in $LINKS; do
        _link=$BIN_DIR/$_cmd
        if [ -L "$_link" ] && [ "$(readlink "$_link")" = "$BIN_DIR/kelp" ]; then
            continue
        fi
        if [ "${INSTALL_KELP_SYMLINK:-}" != force ]; then
            if [ -e "$_link" ] || [ -L "$_link" ]; then
                info "leaving $_link as it is (set INSTALL_KELP_SYMLINK=force to replace it): use 'kelp $_cmd'"
                continue
            fi
            if _other=$(command -v "$_cmd" 2>/dev/null); then
                info "$_cmd exists at $_other: no link made (set INSTALL_KELP_SYMLINK=force to make one): use 'kelp $_cmd'"
                continue
            fi
        fi
        as_root ln -sf "$BIN_DIR/kelp" "$_link"
        info "linked $_link to kelp"
    done
}

write_env_file() {
    printf '%s' "$ENV_LINES" | write_file "$ENV_FILE" 0600
}

write_systemd_unit() {
    _pre=
    if _modprobe=$(command -v modprobe 2>/dev/null); then
        # Without modprobe (a minimal image) kelp's check-config says what
        # is missing; with it, a failure here is not fatal either ("-").
        _pre="ExecStartPre=-$_modprobe br_netfilter
ExecStartPre=-$_modprobe overlay
"
    fi
    write_file "$SERVICE_FILE" 0644 <<EOF
# Written by kelp's install.sh; running it again rewrites this file.
[Unit]
Description=kelp $ROLE: Kubernetes in one binary
Documentation=https://github.com/kelp-dev/kelp
Wants=network-online.target
After=network-online.target

[Install]
WantedBy=multi-user.target

[Service]
Type=notify
EnvironmentFile=-$ENV_FILE
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=5s
${_pre}ExecStart=$BIN_DIR/kelp $ROLE$SD_ARGS
EOF
}

write_openrc_script() {
    write_file "$SERVICE_FILE" 0755 <<EOF
#!$OPENRC_RUN
# Written by kelp's install.sh; running it again rewrites this file.

description="kelp $ROLE: Kubernetes in one binary"
supervisor=supervise-daemon
command=$(quote "$BIN_DIR/kelp")
command_args=$(quote "$ROLE$SH_ARGS")
output_log=/var/log/$SERVICE.log
error_log=/var/log/$SERVICE.log
pidfile=/run/$SERVICE.pid
respawn_delay=5
respawn_max=0

set -a
[ ! -f $(quote "$ENV_FILE") ] || . $(quote "$ENV_FILE")
set +a

# Only soft dependencies: Debian's OpenRC has no localmount service (its
# mounts are done by the LSB scripts), and a need of one it lacks keeps
# kelp from starting at all.
depend() {
    want cgroups
    after localmount net-online
}

start_pre() {
    if command -v modprobe >/dev/null 2>&1; then
        modprobe br_netfilter 2>/dev/null || true
        modprobe overlay 2>/dev/null || true
    fi
}
EOF
}

# write_scripts writes the killall and uninstall scripts. Their settings
# are fixed at install time; their bodies are the same for every install.
write_scripts() {
    _other=kelp-agent
    [ "$SERVICE" = kelp ] || _other=kelp
    _killall_settings="BIN_DIR=$(quote "$BIN_DIR")
DATA_DIR=$(quote "$DATA_DIR")
SERVICE=$SERVICE
MANAGER=$MANAGER
"
    _settings="${_killall_settings}SERVICE_FILE=$(quote "$SERVICE_FILE")
ENV_FILE=$(quote "$ENV_FILE")
OTHER_SERVICE_FILE=$(quote "$(service_file "$_other")")
KILLALL=$(quote "$BIN_DIR/kelp-killall.sh")
LINKS=$(quote "$LINKS")
"
    {
        cat <<'EOF'
#!/bin/sh
# Written by kelp's install.sh: stops the kelp service, then kelp itself,
# its containerd, shims and containers, unmounts what it mounted and
# removes its interfaces and nftables tables (kelp killall). Data is kept;
# start the service again to bring the node back.
set -eu
EOF
        printf '%s' "$_killall_settings"
        cat <<'EOF'
[ "$(id -u)" -eq 0 ] || exec sudo "$0" "$@"
case $MANAGER in
    systemd) systemctl stop "$SERVICE" 2>/dev/null || true ;;
    openrc) rc-service "$SERVICE" stop 2>/dev/null || true ;;
esac
if [ -x "$BIN_DIR/kelp" ]; then
    "$BIN_DIR/kelp" killall --data-dir "$DATA_DIR"
fi
EOF
    } | write_file "$BIN_DIR/kelp-killall.sh" 0755

    {
        cat <<'EOF'
#!/bin/sh
# Written by kelp's install.sh: removes what it installed. Stops kelp and
# its containers (kelp-killall.sh), removes the service, its env file, the
# binary and the links to it, kelp's config, its data dir, the kubelet's
# and kelp's runtime dirs, and this script. Nothing else.
set -eu
EOF
        printf '%s' "$_settings"
        cat <<'EOF'
[ "$(id -u)" -eq 0 ] || exec sudo "$0" "$@"

# remove_dir DIR removes DIR and what is in it, unless something is still
# mounted below it: rm would then delete a volume's data.
remove_dir() {
    [ -e "$1" ] || return 0
    _mounts=$(awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts)
    if [ -n "$_mounts" ]; then
        echo "kelp uninstall: $1 is not removed: still mounted below it: $_mounts" >&2
        STATUS=1
        return 0
    fi
    find "$1" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
    # A mount point itself (a tmpfs, a separate disk) stays, empty.
    rmdir "$1" 2>/dev/null || true
}

STATUS=0
if [ -x "$KILLALL" ]; then
    "$KILLALL" || { echo "kelp uninstall: kelp-killall.sh failed; not removing data that may be in use" >&2; exit 1; }
fi
case $MANAGER in
    systemd)
        systemctl disable "$SERVICE" 2>/dev/null || true
        systemctl reset-failed "$SERVICE" 2>/dev/null || true
        rm -f "$SERVICE_FILE" "$ENV_FILE"
        systemctl daemon-reload 2>/dev/null || true
        ;;
    openrc)
        rc-update delete "$SERVICE" default 2>/dev/null || true
        rm -f "$SERVICE_FILE" "$ENV_FILE" "/var/log/$SERVICE.log"
        ;;
    *) rm -f "$ENV_FILE" ;;
esac
rm -f "$0"
if [ -n "$OTHER_SERVICE_FILE" ] && [ -e "$OTHER_SERVICE_FILE" ]; then
    echo "kelp uninstall: $SERVICE removed; the other kelp service ($OTHER_SERVICE_FILE) stays, with the binary and data"
    exit 0
fi

# The clusters of `kelp cluster` go with the kelp they run: their nodes
# are processes of this binary, their state is under /var/lib/kelp.
if [ -x "$BIN_DIR/kelp" ] && [ -d /var/lib/kelp/clusters ]; then
    "$BIN_DIR/kelp" cluster delete --all --root /var/lib/kelp/clusters || STATUS=1
fi
for cmd in $LINKS; do
    link=$BIN_DIR/$cmd
    if [ -L "$link" ] && [ "$(readlink "$link")" = "$BIN_DIR/kelp" ]; then
        rm -f "$link"
    fi
done
rm -f "$BIN_DIR/kelp" "$BIN_DIR/kelp.previous" "$KILLALL"
remove_dir /etc/kelp
remove_dir "$DATA_DIR"
remove_dir /var/lib/kubelet
remove_dir /run/kelp
remove_dir /var/log/pods
remove_dir /var/log/containers
if [ "$STATUS" -eq 0 ]; then
    echo "kelp uninstall: kelp is removed"
fi
exit "$STATUS"
EOF
    } | write_file "$UNINSTALL" 0755
}

start_service() {
    case $MANAGER in
        systemd)
            as_root systemctl daemon-reload
            if is_true "${INSTALL_KELP_SKIP_ENABLE:-}"; then
                info "not enabling or starting $SERVICE (INSTALL_KELP_SKIP_ENABLE=true)"
                return
            fi
            as_root systemctl enable "$SERVICE" >/dev/null 2>&1 || as_root systemctl enable "$SERVICE"
            if is_true "${INSTALL_KELP_SKIP_START:-}"; then
                info "not starting $SERVICE (INSTALL_KELP_SKIP_START=true): systemctl start $SERVICE"
                return
            fi
            info "starting $SERVICE (systemctl restart $SERVICE waits until kelp is ready)"
            as_root systemctl restart "$SERVICE"
            ;;
        openrc)
            if is_true "${INSTALL_KELP_SKIP_ENABLE:-}"; then
                info "not enabling or starting $SERVICE (INSTALL_KELP_SKIP_ENABLE=true)"
                return
            fi
            as_root rc-update add "$SERVICE" default >/dev/null
            if is_true "${INSTALL_KELP_SKIP_START:-}"; then
                info "not starting $SERVICE (INSTALL_KELP_SKIP_START=true): rc-service $SERVICE start"
                return
            fi
            info "starting $SERVICE"
            as_root rc-service "$SERVICE" restart
            ;;
        none)
            info "no systemd or OpenRC here: start kelp by hand, as root:"
            info "  sh -c 'set -a; . $ENV_FILE; exec $BIN_DIR/kelp $ROLE$SH_ARGS'"
            ;;
    esac
}

main() {
    setup_root
    setup_arch
    setup_bin_dir
    setup_service_manager
    KEEP=
    if keep_existing_service "$@"; then
        KEEP=1
    else
        parse_command "$@"
    fi
    SERVICE=kelp
    [ "$ROLE" = server ] || SERVICE=kelp-agent
    SERVICE_FILE=$(service_file "$SERVICE")
    ENV_FILE=$(env_file "$SERVICE")
    UNINSTALL=$BIN_DIR/kelp-uninstall.sh
    [ "$ROLE" = server ] || UNINSTALL=$BIN_DIR/kelp-agent-uninstall.sh

    TMP_DIR=$(as_root mktemp -d "$BIN_DIR/.kelp-install.XXXXXX") || fatal "cannot make a temporary directory in $BIN_DIR"
    trap 'as_root rm -rf "$TMP_DIR"' EXIT
    trap 'exit 1' HUP INT TERM

    get_binary
    run_check_config
    install_binary
    install_links
    as_root mkdir -p "$CONFIG_DIR"
    if [ -n "$KEEP" ]; then
        info "keeping the command and settings of $SERVICE_FILE (give arguments or KELP_* settings to change them)"
    else
        write_env_file
        case $MANAGER in
            systemd) write_systemd_unit ;;
            openrc) write_openrc_script ;;
        esac
    fi
    write_scripts
    info "wrote $UNINSTALL and $BIN_DIR/kelp-killall.sh"
    start_service
}

main "$@"
