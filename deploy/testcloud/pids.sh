# Shared by up.sh and down.sh: is a recorded process still the one up.sh started?
# A pid file NAME.pid comes with NAME.start, the process's start time (field 22 of
# /proc/PID/stat): a pid reused by an unrelated process never passes for ours.
# Needs $R, the run directory holding the pid files.
start_time() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
# alive PID: exists and is not a zombie (an orphan's zombie may wait a while for init)
alive() { local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1); [ -n "$st" ] && [ "$st" != Z ]; }
# ours NAME: the pid file names a live process that up.sh started
ours() {
  local pid; pid=$(cat "$R/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && alive "$pid" || return 1
  [ "$(start_time "$pid")" = "$(cat "$R/$1.start" 2>/dev/null)" ]
}
