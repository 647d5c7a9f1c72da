#!/usr/bin/env bash
# Runs the README's Quick start on a bare Debian 12 root file system, as a new user's machine would be.
#
#   scripts/fresh-machine-test.sh [--short] [--keep] [--help]
#
# 1. Builds a minimal Debian 12 root file system (`debootstrap --variant=minbase bookworm`) from the
#    mirror the host's own apt configuration names, once: the result is cached as a tarball in
#    $ACTLAB_FRESH_CACHE (default /var/tmp/actlab-fresh-machine) and unpacked anew for every run.
# 2. Clones this repository's HEAD commit into it (uncommitted changes are not part of the test).
# 3. Reads the two commands of the README's "Quick start" block and runs them, exactly as written, in
#    the chroot as root, one after the other, printing the wall time of each.
#    --short appends `--steps-per-epoch 20 --test-limit 500` to the first one (CI: a short training;
#    the install and build it does are the whole ones).
# 4. Prints one last line: `fresh machine: ok`, `fresh machine: FAILED <first error line>` (exit 1),
#    or `fresh machine: SKIPPED <why>` (exit 77) when this machine cannot build a chroot (not root,
#    no debootstrap to be had, mounts refused, mirror unreachable).
#
# The chroot runs in its own mount and PID namespaces (unshare): proc, dev and sys are mounted there
# only, and when this script ends, however it ends (a SIGKILL of the process you started included),
# the kernel drops those mounts and every process still running in the chroot. On a normal exit,
# Ctrl-C or SIGTERM the script also unmounts and removes its work directory itself; after a SIGKILL
# the next run removes the work directory left behind. --keep leaves the root file system in place
# (its path is printed) to look into a failure.
set -euo pipefail

usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }

short=0 keep=0 inner=""
while [ $# -gt 0 ]; do
  case "$1" in
    --short) short=1 ;;
    --keep) keep=1 ;;
    --help | -h) usage; exit 0 ;;
    --inner) inner="$2"; shift ;;  # internal: the part that runs inside the namespaces
    *) echo "fresh-machine-test: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

repo="$(cd "$(dirname "$0")/.." && pwd)"
cache="${ACTLAB_FRESH_CACHE:-/var/tmp/actlab-fresh-machine}"
suite=bookworm

skip() { echo "fresh machine: SKIPPED $*"; exit 77; }
fail() { echo "fresh machine: FAILED $*"; exit 1; }
# The mount points at or below DIR, deepest first, one per line. /proc/self/mounts writes a space in a
# path as \040 (decoded here), so a cache directory with a space in its name is matched too: missing a
# bind mount of /dev there would let the `rm -rf` below reach the host's device nodes.
mounts_under() {  # mounts_under DIR
  local m
  awk '{print $2}' /proc/self/mounts | while IFS= read -r m; do
    m=$(printf '%b' "$m")
    case "$m" in "$1" | "$1"/*) printf '%s\n' "$m" ;; esac
  done | sort -r
}

# ---------------------------------------------------------------- inside the namespaces
if [ -n "$inner" ]; then
  work="$inner" root="$inner/root"
  cleanup() {
    local m
    # Deepest mount first; the namespace would drop them anyway, this keeps `rm` off a mounted /dev, and
    # --one-file-system keeps it off one that did not unmount.
    while IFS= read -r m; do umount -l "$m" 2>/dev/null || true; done < <(mounts_under "$root")
    if [ "$keep" -eq 0 ]; then rm -rf --one-file-system "$work"; else echo "fresh-machine-test: kept $root"; fi
  }
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mount -t proc proc "$root/proc" || skip "cannot mount proc in the chroot"
  mount --rbind /dev "$root/dev" || skip "cannot bind-mount /dev in the chroot"
  mount -t sysfs sysfs "$root/sys" || skip "cannot mount sysfs in the chroot"
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

  mapfile -t commands < "$work/commands"
  status=0 n=0
  for cmd in "${commands[@]}"; do
    n=$((n + 1))
    [ "$n" -eq 1 ] && [ "$short" -eq 1 ] && cmd="$cmd --steps-per-epoch 20 --test-limit 500"
    echo "fresh-machine-test: [$n/${#commands[@]}] $cmd"
    started=$(date +%s)
    set +e
    # A login-like environment: what a new user's root shell has, nothing of this one.
    chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 CI="${CI:-}" \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      /bin/bash -c "cd /root/actlab && $cmd" 2>&1 | tee "$work/log.$n"
    status=${PIPESTATUS[0]}
    set -e
    echo "fresh-machine-test: [$n/${#commands[@]}] exit $status after $(($(date +%s) - started)) s"
    if [ "$status" -ne 0 ]; then
      # The first line that reads like an error; else the last line the command printed.
      # A CMake error's own words are on the line after "CMake Error at FILE:LINE (message):".
      first=$(grep -m1 -A1 -E '(^|[^a-z])([Ee]rror|ERROR|FAILED|[Ff]atal|cannot|Could NOT|not found)' "$work/log.$n" \
              | awk 'NR == 1 && /CMake Error/ { head = $0; next } { sub(/^[ \t]+/, ""); print (head ? head " " : "") $0; exit }
                     END { if (NR == 1) print head }' || true)
      [ -n "$first" ] || first=$(tail -n 1 "$work/log.$n")
      fail "command $n ($cmd) exit $status: $first"
    fi
  done
  echo "fresh machine: ok"
  exit 0
fi

# ---------------------------------------------------------------- outside: prerequisites
[ "$(id -u)" -eq 0 ] || skip "(not root: debootstrap, chroot and mounts need root)"
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "fresh-machine-test: installing debootstrap"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap; } \
    >/dev/null 2>&1 || skip "(debootstrap is not installed and apt-get could not install it)"
fi
command -v unshare >/dev/null 2>&1 || skip "(no unshare: util-linux is missing)"
unshare --mount --pid --fork --kill-child --propagation private true 2>/dev/null \
  || skip "(this machine refuses new mount/PID namespaces: cannot isolate the chroot's mounts)"

# The Quick start: the non-comment lines of the first ``` block after the "## Quick start" heading,
# each less its trailing "# ..." comment.
mapfile -t commands < <(awk '
  /^## Quick start/ { inside = 1; next }
  inside && /^```/ { if (block) exit; block = 1; next }
  inside && /^## / { exit }
  block && NF && $1 !~ /^#/ { sub(/[ \t]+#.*$/, ""); print }
' "$repo/README.md")
[ "${#commands[@]}" -eq 2 ] || fail "README.md's Quick start block has ${#commands[@]} commands, expected 2"

# The mirror: the first `deb` source of the host's apt configuration that serves $suite itself (not
# -updates or -security), from deb822 .sources files or one-line .list files.
host_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$suite" '
      function flush() { if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && uri != "" && enabled != "no") { print uri; found = 1; exit } }
      /^[ \t]*$/ { flush(); types = suites = uri = enabled = ""; next }
      /^[ \t]*#/ { next }
      tolower($1) == "types:" { $1 = ""; types = $0 }
      tolower($1) == "suites:" { $1 = ""; suites = $0 }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "enabled:" { enabled = tolower($2) }
      END { if (!found) flush() }
    ' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v suite="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while ($i !~ /\]$/) i++; if ($2 ~ /^\[/) i++; if ($(i + 1) == suite) print $i }' "$f"
  done
}
mirror=$(host_mirror | head -n 1)
[ -n "$mirror" ] || skip "(the host's apt configuration names no 'deb' source for $suite)"

# Work directories of runs that were SIGKILLed (their pid file names a dead process) go first.
mkdir -p "$cache" || skip "(cannot create the cache directory $cache)"
for old in "$cache"/run.*; do
  [ -d "$old" ] || continue
  pid=$(cat "$old/pid" 2>/dev/null || echo 0)
  if [ "$pid" -gt 0 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
  [ -n "$(mounts_under "$old")" ] && continue  # still mounted somewhere: leave it alone
  rm -rf --one-file-system "$old"
done

arch=$(dpkg --print-architecture)
tarball="$cache/$suite-minbase-$arch-$(echo "$mirror" | md5sum | cut -c1-8).tar.gz"
if [ ! -f "$tarball" ]; then
  echo "fresh-machine-test: debootstrap --variant=minbase $suite from $mirror (once; cached as $tarball)"
  base="$cache/base.$$"
  rm -rf "$base"
  started=$(date +%s)
  # In namespaces of its own too: debootstrap mounts proc and sys in the target while it works.
  if ! unshare --mount --pid --fork --kill-child --propagation private \
      debootstrap --variant=minbase "$suite" "$base" "$mirror" > "$cache/debootstrap.log" 2>&1; then
    rm -rf "$base"
    skip "(debootstrap from $mirror failed: $(grep -m1 -E '^E:' "$cache/debootstrap.log" || tail -n 1 "$cache/debootstrap.log"))"
  fi
  rm -rf "$base/var/cache/apt/archives/"*.deb
  tar -C "$base" -czf "$tarball.part" . && mv "$tarball.part" "$tarball"
  rm -rf "$base"
  echo "fresh-machine-test: base system built in $(($(date +%s) - started)) s"
fi

work=$(mktemp -d "$cache/run.XXXXXX")
echo $$ > "$work/pid"
root="$work/root"
mkdir -p "$root"
started=$(date +%s)
tar -C "$root" -xzf "$tarball" || { rm -rf "$work"; fail "cannot unpack $tarball"; }
# apt in the chroot reaches the mirror the way the host's apt does: its sources and its settings
# (debootstrap's own sources.list names only the mirror's main suite).
rm -f "$root/etc/apt/sources.list"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && cp "$f" "$root$f"
done
for f in /etc/apt/apt.conf.d/*; do
  [ -f "$f" ] && grep -q "Acquire" "$f" && cp "$f" "$root$f"
done
head=$(git -C "$repo" rev-parse HEAD)
git clone --quiet --no-hardlinks "$repo" "$root/root/actlab" && git -C "$root/root/actlab" checkout --quiet --detach "$head" \
  || { rm -rf "$work"; fail "cannot clone $repo into the chroot"; }
[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] \
  || echo "fresh-machine-test: note: the work tree has uncommitted changes; testing commit $head without them"
printf '%s\n' "${commands[@]}" > "$work/commands"
echo "fresh-machine-test: root file system ready in $(($(date +%s) - started)) s ($root, commit ${head:0:12})"

# exec: the process that was started becomes unshare, so killing it (even with SIGKILL) kills, through
# --kill-child, the inner script and with it every process of the PID namespace; the mounts go with
# the namespace. The inner script removes the work directory on its way out.
args=(--inner "$work")
[ "$short" -eq 1 ] && args+=(--short)
[ "$keep" -eq 1 ] && args+=(--keep)
exec unshare --mount --pid --fork --kill-child --propagation private bash "$0" "${args[@]}"
