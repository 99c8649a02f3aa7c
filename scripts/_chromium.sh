# Sourced by scripts/test: Debian's Chromium for the dashboard's browser tests, installed
# in the background. apt takes one lock per machine: while another apt-get holds it (a
# second worktree's tests, unattended upgrades), this waits for it rather than failing.
#
#   install_chromium LOG   0 installed (or there already), 1 apt failed (LOG says why),
#                          2 apt's lock stayed busy for APT_LOCK_WAIT seconds
#   chromium_outcome LOG STATUS   the one line scripts/test prints for it

CHROMIUM_BIN="${CHROMIUM_BIN:-/usr/bin/chromium}"
APT_LOCK_WAIT="${APT_LOCK_WAIT:-600}"  # seconds to wait for apt's lock, at most
APT_LOCK_STEP="${APT_LOCK_STEP:-5}"    # seconds between tries while it is held

_apt_lock_busy() {
  grep -qE "Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock directory" "$1"
}

install_chromium() {
  local log="$1" attempt="$1.attempt" waited=0 busy=0
  : >"$log"
  [ -x "$CHROMIUM_BIN" ] && return 0
  while :; do
    if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
        >"$attempt" 2>&1; then
      if [ "$busy" -gt 0 ]; then
        echo "after waiting ${waited}s for apt's lock, busy $busy time(s)" >>"$log"
      fi
      return 0
    fi
    if ! _apt_lock_busy "$attempt"; then
      cat "$attempt" >>"$log"
      return 1
    fi
    if [ "$waited" -ge "$APT_LOCK_WAIT" ]; then
      echo "apt's lock stayed busy for ${waited}s: another apt-get is still running" >>"$log"
      return 2
    fi
    busy=$((busy + 1))
    sleep "$APT_LOCK_STEP"
    waited=$((waited + APT_LOCK_STEP))
  done
}

chromium_outcome() {
  local log="$1" status="$2"
  case "$status" in
    0) if [ -s "$log" ]; then echo "chromium installed ($(cat "$log"))"; else echo "chromium installed"; fi ;;
    2) echo "chromium not installed: $(tail -1 "$log"); the browser tests will be skipped" ;;
    *) echo "installing chromium failed:"; tail -20 "$log" ;;
  esac
}
