// Stop requests: SIGINT/SIGTERM/SIGHUP record a signal that the trainer polls once per step, so a run
// ends after its current step with its state saved (train/trainer.h). Tested in tests/test_checkpoint.cpp
// and tests/cli/resume.sh.
#pragma once

namespace actlab {

// SIGINT/SIGTERM handlers that only record the signal (the trainer polls once per step); the second
// signal of a kind gets the default action, so a second Ctrl-C ends the process at once. SIGHUP (the
// terminal closed, or actlab-ablate gone: its children's parent-death signal) is a stop request too, but
// never escalates: a process losing its parent gets it once per exiting thread of that parent. A SIGHUP
// that is ignored (nohup) stays ignored.
void install_stop_handlers();
int stop_signal();               // 0, or the signal number received
void request_stop(int signal);   // as if `signal` had arrived; 0 clears a request

}  // namespace actlab
