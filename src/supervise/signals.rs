//! Which signals reach the command, and how: decided from what gpudoc's two processes saw.
//!
//! gpudoc runs as two processes: the guard (the PID the shell or scheduler started, see [`super::guard`])
//! and gpudoc proper, its child. A signal can reach the guard alone (`kill PID`), the whole process group
//! (`kill -- -PGID`, `timeout`, a shell relaying a hang-up, Ctrl-C), or every process of a job (Slurm's and
//! systemd's cgroup kills); the kernel tells none of these apart in the signal itself. The guard relays
//! every signal it takes to gpudoc ([`Relay`]); gpudoc takes its own deliveries as well. A signal that
//! reached gpudoc *directly* reached the processes around it; one that came only through the guard
//! reached the guard alone. With the command in gpudoc's own process group ([`Mode::Shared`]) a direct
//! delivery therefore reached the command too, and nothing is sent again; with the command on a terminal
//! of its own ([`Mode::Terminal`]) nothing sent to gpudoc's group reaches it, and gpudoc passes it on.
//!
//! [`Pairing`] matches the guard's relay of a signal with gpudoc's own copy of it (same signal, same
//! sender, within [`PAIR_WINDOW`]); [`decide`] says what one matched event asks for. Both are pure: the
//! caller sends.

use std::time::{Duration, Instant};

/// How long a signal seen by one of gpudoc's processes waits for the other's copy before it is taken as
/// seen by that one alone. The guard relays within microseconds; a loaded machine may take milliseconds.
pub const PAIR_WINDOW: Duration = Duration::from_millis(20);

/// Where the command runs, as far as signals go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In gpudoc's process group: whatever reaches the group or the terminal's foreground reaches it
    /// directly, as it would without gpudoc.
    Shared,
    /// On a pseudo-terminal of its own, in a session of its own: the terminal's keys reach it through its
    /// terminal; only gpudoc passes on what is sent to gpudoc.
    Terminal,
}

/// One delivery of a signal to the guard or to gpudoc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub sig: i32,
    /// Sent by the kernel: a terminal's key, hang-up or resize (`SI_KERNEL`).
    pub kernel: bool,
    /// The sending process (0 when the kernel sent it).
    pub sender: i32,
    /// Relayed by the guard (else taken by gpudoc itself).
    pub relayed: bool,
}

/// Who saw a signal: the guard, gpudoc, or both (it was sent to more than the guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub sig: i32,
    pub kernel: bool,
    pub sender: i32,
    pub guard: bool,
    pub direct: bool,
}

/// The guard's relay carries the signal, whether the kernel sent it, and its sender in one `int`
/// (`sigqueue`'s value): 7 bits, 1 bit, 24 bits (Linux pids stay under 2^22).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relay {
    pub sig: i32,
    pub kernel: bool,
    pub sender: i32,
}

impl Relay {
    pub fn encode(self) -> i32 {
        (self.sig & 0x7f) | (i32::from(self.kernel) << 7) | ((self.sender & 0xff_ffff) << 8)
    }

    pub fn decode(v: i32) -> Relay {
        Relay {
            sig: v & 0x7f,
            kernel: v & 0x80 != 0,
            sender: (v >> 8) & 0xff_ffff,
        }
    }
}

/// What gpudoc does about one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing: the command got it as it would have without gpudoc (or it was gpudoc's own).
    Nothing,
    /// Send the signal to the command.
    Forward(i32),
    /// The terminal changed size: the command's pseudo-terminals follow it (the kernel tells the
    /// command); `also` forwards a resize signal that was sent, not the terminal's.
    Resize { also: bool },
    /// The terminal hung up: the command gets what a hang-up gives (its terminal's foreground group gets
    /// SIGHUP and SIGCONT), and gpudoc keeps reading its terminal so that it never blocks writing.
    HangUp,
    /// Continued: what was stopped of the job goes on.
    Continue,
}

/// What one event asks for. `sender_above` is whether the sender is an ancestor of the guard (a job
/// manager: Slurm's step daemon, systemd, a shell), which signals a whole job rather than gpudoc alone.
pub fn decide(mode: Mode, e: &Event, sender_above: bool) -> Action {
    use libc::*;
    let only_guard = e.guard && !e.direct;
    match (e.sig, mode) {
        (SIGCHLD, _) => Action::Nothing,
        (SIGCONT, _) => Action::Continue,
        // The terminal's resize goes to its foreground group (the command's, in Shared mode), or is
        // passed through the command's own terminal; one sent by a process is passed on as sent.
        (SIGWINCH, _) => Action::Resize {
            also: !e.kernel && only_guard,
        },
        // The guard leads the session and the terminal hung up: only the session leader hears it.
        (SIGHUP, Mode::Terminal) if e.kernel && e.guard => Action::HangUp,
        // gpudoc leads the command's terminal's session: its own terminal's doings are not the job's.
        (_, Mode::Terminal) if e.kernel && !e.guard => Action::Nothing,
        // Sent to the guard alone (`kill PID`, a scheduler's main-process signal, the guard's death
        // signal to gpudoc, a hang-up heard by the guard as session leader): the command's as it was.
        _ if only_guard || (e.direct && !e.guard) => Action::Forward(e.sig),
        // Sent to the process group, or to every process: in Shared mode the command, a member of
        // the group, got it too.
        (_, Mode::Shared) => Action::Nothing,
        // In Terminal mode the command is in no group of gpudoc's: a job manager signalling every
        // process reached it; a group signal or `pkill gpudoc` did not.
        (_, Mode::Terminal) if sender_above => Action::Nothing,
        (_, Mode::Terminal) => Action::Forward(e.sig),
    }
}

/// Signals that ask gpudoc to end when they are not the terminal's: what the command leaves running is
/// ended too once it exits.
pub fn asks_to_end(e: &Event) -> bool {
    !e.kernel && ending(e.sig)
}

/// The signals that end a job by default and that a user sends to end one.
fn ending(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGTERM | libc::SIGHUP | libc::SIGQUIT | libc::SIGINT
    )
}

/// Someone asked the job to end: SIGINT, SIGTERM, SIGHUP or SIGQUIT sent by a process, or the user's
/// terminal's Ctrl-C, quit key or hang-up (the whole group sees it in Shared mode; with the command on a
/// terminal of its own, the guard, in the user's terminal's foreground, hears it). Not what gpudoc's own
/// session's terminal does. A Ctrl-C typed while the command runs on its own terminal is a key, not a
/// signal: the terminal's relay counts it.
pub fn interrupts(mode: Mode, e: &Event) -> bool {
    asks_to_end(e)
        || e.kernel
            && ending(e.sig)
            && match mode {
                Mode::Shared => e.direct,
                Mode::Terminal => e.guard,
            }
}

/// A Ctrl-C typed on gpudoc's terminal in Shared mode (the terminal sent SIGINT to the whole group).
pub fn is_keypress(e: &Event) -> bool {
    e.kernel && e.sig == libc::SIGINT && e.direct
}

/// How soon after a Ctrl-C the next one must come to count toward gpudoc's kill, when the job answered
/// neither (it wrote nothing in between).
pub const PRESS_WINDOW: Duration = Duration::from_secs(3);
/// Unanswered Ctrl-C presses in a row after which gpudoc kills the job's tree (the one before says so).
pub const FORCE_PRESSES: usize = 3;

/// What gpudoc does about one Ctrl-C press.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Press {
    /// The job's alone: it answered the last press, or this one came long after it.
    Jobs,
    /// The job has not answered this many presses in a row: the next one, unanswered too, kills it.
    Warn(usize),
    /// The job answered none of [`FORCE_PRESSES`] presses in a row: kill its tree.
    Kill,
}

/// Ctrl-C presses the job did not answer: a REPL, `pdb`, a shell or a server asking "Shutdown?" answers
/// each (it writes), so it is never killed however many it gets; a job stuck in a call (a hung collective,
/// a CUDA sync) writes nothing, and three quick presses end it. Pure: the caller says whether the job
/// wrote since the last press.
#[derive(Debug, Default)]
pub struct Presses {
    last: Option<Instant>,
    streak: usize,
}

impl Presses {
    /// A press at `now`; `answered`: the job wrote something since the last press.
    pub fn press(&mut self, now: Instant, answered: bool) -> Press {
        let soon = self
            .last
            .is_some_and(|t| now.duration_since(t) < PRESS_WINDOW);
        self.streak = if soon && !answered {
            self.streak + 1
        } else {
            1
        };
        self.last = Some(now);
        match self.streak {
            n if n >= FORCE_PRESSES => Press::Kill,
            n if n + 1 == FORCE_PRESSES => Press::Warn(n),
            _ => Press::Jobs,
        }
    }
}

/// How gpudoc ends a job it was asked to end (`--stop-on`, the end of a run of `gpudoc fit`), step by step:
/// SIGINT, as the user's Ctrl-C; SIGTERM; SIGKILL to its whole tree.
pub const ENDING_STEPS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGKILL];
/// The longest a job is given after one step of its ending before the next, however busy it keeps.
pub const ENDING_MOST: Duration = Duration::from_secs(120);

/// Advances of a job's work (the shim's optimizer step records) seen after a step of its ending that say
/// it went on working instead of ending: the first may be the work under way when the signal came, the
/// second was begun after it.
pub const WORKED_ON: u32 = 2;

/// When the next step of ending a job is due: once it has written nothing for `quiet` since the last step
/// (a handler saving a checkpoint on KeyboardInterrupt writes: it gets the time it takes, as under a
/// user's Ctrl-C); at once when its work went on past the step ([`WORKED_ON`]: a handler that swallows
/// the signal, writing as it trains, has not answered it); and at most [`ENDING_MOST`] after it. Pure: the
/// caller says whether the job wrote and how far its work has come.
#[derive(Debug)]
pub struct Ending {
    quiet: Duration,
    sent: usize,
    at: Option<Instant>,
    last_write: Option<Instant>,
    waited: Duration,
    /// The latest work seen, and how often it advanced since the last step.
    work: u64,
    advanced: u32,
    /// The last step was sent because the job worked on past the one before.
    worked_on: bool,
}

impl Ending {
    pub fn new(quiet: Duration) -> Ending {
        Ending {
            quiet,
            sent: 0,
            at: None,
            last_write: None,
            waited: Duration::ZERO,
            work: 0,
            advanced: 0,
            worked_on: false,
        }
    }

    /// The signal to send at `now`, if a step is due (the first is due at once); `wrote`: the job wrote
    /// since the last look; `work`: the latest unit of its work its caller counts (the last optimizer step
    /// the shim recorded; 0 where nothing counts it).
    pub fn due(&mut self, now: Instant, wrote: bool, work: u64) -> Option<i32> {
        if wrote {
            self.last_write = Some(now);
        }
        if work > self.work {
            self.work = work;
            self.advanced += u32::from(self.at.is_some());
        }
        let worked_on = self.advanced >= WORKED_ON;
        let due = match self.at {
            None => true,
            Some(_) if self.sent >= ENDING_STEPS.len() => false,
            Some(at) => {
                let busy = self.last_write.map_or(at, |w| w.max(at));
                worked_on
                    || now.duration_since(busy) >= self.quiet
                    || now.duration_since(at) >= ENDING_MOST
            }
        };
        if !due {
            return None;
        }
        let sig = ENDING_STEPS[self.sent];
        self.sent += 1;
        self.waited = self.at.map_or(Duration::ZERO, |at| now.duration_since(at));
        self.at = Some(now);
        self.worked_on = worked_on;
        self.advanced = 0;
        Some(sig)
    }

    /// Whether the last step was sent because the job's work went on past the one before.
    pub fn worked_on(&self) -> bool {
        self.worked_on
    }

    /// How long the job was given between the last two steps.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Signals sent so far, in order.
    pub fn sent(&self) -> &'static [i32] {
        &ENDING_STEPS[..self.sent]
    }
}

/// Matches each relay with gpudoc's own copy of the same signal.
#[derive(Debug, Default)]
pub struct Pairing {
    waiting: Vec<(Seen, Instant)>,
    /// Events decided lately, by (signal, sender): a late copy of one is the same event.
    decided: Vec<(i32, i32, Instant)>,
}

impl Pairing {
    /// Takes one delivery; the event it completes, if it matched one waiting.
    pub fn seen(&mut self, s: Seen, now: Instant) -> Option<Event> {
        let recent = |&(sig, sender, at): &(i32, i32, Instant)| {
            sig == s.sig && sender == s.sender && now.duration_since(at) < PAIR_WINDOW
        };
        if self.decided.iter().any(recent) {
            return None;
        }
        let other = self
            .waiting
            .iter()
            .position(|(w, _)| w.sig == s.sig && w.sender == s.sender && w.relayed != s.relayed);
        match other {
            Some(i) => {
                self.waiting.remove(i);
                self.decided.push((s.sig, s.sender, now));
                Some(event(&s, true, true))
            }
            None => {
                // A second copy from the same side (the guard relayed two deliveries the kernel did not
                // merge) is the same event.
                if !self.waiting.iter().any(|(w, _)| *w == s) {
                    self.waiting.push((s, now));
                }
                None
            }
        }
    }

    /// The events whose other copy did not come in time.
    pub fn expired(&mut self, now: Instant) -> Vec<Event> {
        self.decided
            .retain(|&(_, _, at)| now.duration_since(at) < PAIR_WINDOW);
        let mut out = Vec::new();
        self.waiting.retain(|(s, at)| {
            if now.duration_since(*at) < PAIR_WINDOW {
                return true;
            }
            out.push(event(s, s.relayed, !s.relayed));
            false
        });
        for e in &out {
            self.decided.push((e.sig, e.sender, now));
        }
        out
    }

    /// When the next waiting delivery expires.
    pub fn deadline(&self) -> Option<Instant> {
        self.waiting.iter().map(|(_, at)| *at + PAIR_WINDOW).min()
    }
}

fn event(s: &Seen, guard: bool, direct: bool) -> Event {
    Event {
        sig: s.sig,
        kernel: s.kernel,
        sender: s.sender,
        guard,
        direct,
    }
}

/// `SIGTERM` for 15; `signal 64` for what has no name.
pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use libc::*;

    fn ev(sig: i32, kernel: bool, guard: bool, direct: bool) -> Event {
        Event {
            sig,
            kernel,
            sender: if kernel { 0 } else { 4242 },
            guard,
            direct,
        }
    }

    #[test]
    fn a_ctrl_c_or_a_terminating_signal_from_anyone_but_gpudocs_own_terminal_interrupts() {
        for mode in [Mode::Shared, Mode::Terminal] {
            // `kill -INT -PGID`, `kill PID`, `timeout`: sent by a process, to the group or the guard.
            for (guard, direct) in [(true, true), (true, false), (false, true)] {
                for sig in [SIGINT, SIGTERM, SIGHUP, SIGQUIT] {
                    assert!(interrupts(mode, &ev(sig, false, guard, direct)), "{mode:?}");
                }
                assert!(!interrupts(mode, &ev(SIGUSR1, false, guard, direct)));
                assert!(!interrupts(mode, &ev(SIGWINCH, false, guard, direct)));
            }
        }
        // The terminal's Ctrl-C to its foreground group: gpudoc's and the command's in Shared mode; the
        // guard's on a terminal of the command's own (between two runs of `gpudoc fit`).
        assert!(interrupts(Mode::Shared, &ev(SIGINT, true, true, true)));
        assert!(interrupts(Mode::Terminal, &ev(SIGINT, true, true, false)));
        assert!(interrupts(Mode::Terminal, &ev(SIGHUP, true, true, false)));
        // gpudoc's own session's terminal is not the user's.
        assert!(!interrupts(Mode::Terminal, &ev(SIGINT, true, false, true)));
        assert!(!interrupts(
            Mode::Terminal,
            &ev(SIGWINCH, true, true, false)
        ));
    }

    #[test]
    fn a_relay_round_trips_its_signal_origin_and_sender() {
        for r in [
            Relay {
                sig: SIGINT,
                kernel: true,
                sender: 0,
            },
            Relay {
                sig: SIGTERM,
                kernel: false,
                sender: 4_194_303,
            },
            Relay {
                sig: 64,
                kernel: false,
                sender: 1,
            },
        ] {
            assert_eq!(Relay::decode(r.encode()), r);
        }
    }

    #[test]
    fn a_signal_to_the_guard_alone_is_passed_on_in_both_modes() {
        for mode in [Mode::Shared, Mode::Terminal] {
            for sig in [SIGINT, SIGTERM, SIGUSR1, SIGQUIT, SIGHUP, SIGALRM, SIGTSTP] {
                assert_eq!(
                    decide(mode, &ev(sig, false, true, false), false),
                    Action::Forward(sig)
                );
            }
        }
    }

    #[test]
    fn a_group_signal_reached_a_command_that_shares_the_group() {
        for sig in [SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGTSTP] {
            let group = ev(sig, false, true, true);
            assert_eq!(decide(Mode::Shared, &group, false), Action::Nothing);
            assert_eq!(decide(Mode::Shared, &group, true), Action::Nothing);
            // The command on its own terminal is in no group of gpudoc's.
            assert_eq!(decide(Mode::Terminal, &group, false), Action::Forward(sig));
        }
    }

    #[test]
    fn a_job_manager_signalling_every_process_is_not_repeated() {
        let all = ev(SIGTERM, false, true, true);
        assert_eq!(decide(Mode::Terminal, &all, true), Action::Nothing);
    }

    #[test]
    fn keys_of_the_shared_terminal_reached_the_command_already() {
        for sig in [SIGINT, SIGQUIT, SIGTSTP] {
            assert_eq!(
                decide(Mode::Shared, &ev(sig, true, true, true), false),
                Action::Nothing
            );
        }
        assert!(is_keypress(&ev(SIGINT, true, true, true)));
        assert!(!is_keypress(&ev(SIGINT, false, true, true)));
    }

    #[test]
    fn a_hang_up_heard_by_the_guard_alone_reaches_the_command() {
        // The guard leads the session: the kernel tells it alone.
        assert_eq!(
            decide(Mode::Shared, &ev(SIGHUP, true, true, false), false),
            Action::Forward(SIGHUP)
        );
        assert_eq!(
            decide(Mode::Terminal, &ev(SIGHUP, true, true, false), false),
            Action::HangUp
        );
        // The session's leader exited: the kernel told the whole foreground group, command included.
        assert_eq!(
            decide(Mode::Shared, &ev(SIGHUP, true, true, true), false),
            Action::Nothing
        );
    }

    #[test]
    fn resizes_follow_the_terminal_and_a_sent_winch_is_passed_on() {
        assert_eq!(
            decide(Mode::Shared, &ev(SIGWINCH, true, true, true), false),
            Action::Resize { also: false }
        );
        assert_eq!(
            decide(Mode::Terminal, &ev(SIGWINCH, true, true, false), false),
            Action::Resize { also: false }
        );
        assert_eq!(
            decide(Mode::Terminal, &ev(SIGWINCH, false, true, false), false),
            Action::Resize { also: true }
        );
    }

    #[test]
    fn gpudocs_own_terminal_is_not_the_jobs_business() {
        // In Terminal mode gpudoc leads the command's pseudo-terminal's session.
        assert_eq!(
            decide(Mode::Terminal, &ev(SIGHUP, true, false, true), false),
            Action::Nothing
        );
    }

    #[test]
    fn a_kill_of_gpudocs_own_pid_is_passed_on() {
        assert_eq!(
            decide(Mode::Shared, &ev(SIGTERM, false, false, true), false),
            Action::Forward(SIGTERM)
        );
    }

    #[test]
    fn only_quick_presses_the_job_did_not_answer_kill_it() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // A job that writes nothing: the second press warns, a quick third kills.
        let mut p = Presses::default();
        assert_eq!(p.press(at(0), false), Press::Jobs);
        assert_eq!(p.press(at(500), false), Press::Warn(2));
        assert_eq!(p.press(at(1000), false), Press::Kill);
        // A REPL answers every press: never killed, however many.
        let mut p = Presses::default();
        for i in 0..10 {
            assert_eq!(p.press(at(i * 300), true), Press::Jobs);
        }
        // Answered once in between: the count starts again.
        let mut p = Presses::default();
        p.press(at(0), false);
        assert_eq!(p.press(at(200), false), Press::Warn(2));
        assert_eq!(p.press(at(400), true), Press::Jobs);
        assert_eq!(p.press(at(600), false), Press::Warn(2));
        // Presses further apart than the window are each the job's (6 s apart, as the REPL).
        let mut p = Presses::default();
        for i in 0..5 {
            assert_eq!(p.press(at(i * 6000), false), Press::Jobs);
        }
        // The window is between one press and the next.
        let mut p = Presses::default();
        p.press(at(0), false);
        assert_eq!(p.press(at(2900), false), Press::Warn(2));
        assert_eq!(p.press(at(2900 + 3000), false), Press::Jobs);
    }

    #[test]
    fn an_ending_steps_on_only_once_the_job_writes_nothing() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut e = Ending::new(Duration::from_secs(5));
        assert_eq!(e.due(at(0), false, 0), Some(SIGINT));
        assert_eq!(e.due(at(4_999), false, 0), None);
        assert_eq!(e.due(at(5_000), false, 0), Some(SIGTERM));
        // A handler saving a checkpoint keeps writing: it is given the time it takes.
        for ms in (6_000..60_000).step_by(1_000) {
            assert_eq!(e.due(at(ms), true, 0), None);
        }
        assert_eq!(e.due(at(63_999), false, 0), None);
        assert_eq!(e.due(at(64_000), false, 0), Some(SIGKILL));
        assert_eq!(e.due(at(200_000), false, 0), None);
        assert_eq!(e.sent(), &[SIGINT, SIGTERM, SIGKILL]);
        // However busy, at most ENDING_MOST between steps.
        let mut e = Ending::new(Duration::from_secs(5));
        e.due(at(0), false, 0);
        assert_eq!(e.due(at(119_000), true, 0), None);
        assert_eq!(e.due(at(120_000), true, 0), Some(SIGTERM));
    }

    #[test]
    fn an_ending_steps_on_at_once_when_the_jobs_work_goes_on_past_the_signal() {
        // A handler that swallows the SIGINT and trains on, printing each step: it always writes, so
        // only ENDING_MOST ended it. Its steps going on say it did not answer.
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut e = Ending::new(Duration::from_secs(10));
        assert_eq!(e.due(at(0), true, 40), Some(SIGINT));
        // The step under way when the signal came may still end: one advance is no answer yet.
        assert_eq!(e.due(at(500), true, 41), None);
        assert_eq!(e.due(at(900), true, 41), None);
        assert!(!e.worked_on());
        assert_eq!(e.due(at(1_500), true, 42), Some(SIGTERM));
        assert!(e.worked_on());
        assert_eq!(e.waited(), Duration::from_millis(1_500));
        // A job that ignores SIGTERM as well and steps on gets SIGKILL as soon.
        assert_eq!(e.due(at(2_000), true, 43), None);
        assert_eq!(e.due(at(2_500), true, 44), Some(SIGKILL));
        assert_eq!(e.sent(), &[SIGINT, SIGTERM, SIGKILL]);
        // A job that answers stops its steps: its handler's writes get their time, as before.
        let mut e = Ending::new(Duration::from_secs(10));
        e.due(at(0), true, 40);
        assert_eq!(e.due(at(500), true, 41), None);
        for ms in (1_000..60_000).step_by(1_000) {
            assert_eq!(e.due(at(ms), true, 41), None);
        }
        // Work counted before the first step (the steps before the signal) is no advance past it.
        let mut e = Ending::new(Duration::from_secs(10));
        assert_eq!(e.due(at(0), false, 900), Some(SIGINT));
        assert_eq!(e.due(at(100), true, 900), None);
    }

    fn seen(sig: i32, relayed: bool) -> Seen {
        Seen {
            sig,
            kernel: false,
            sender: 77,
            relayed,
        }
    }

    #[test]
    fn a_relay_and_a_direct_copy_pair_into_one_event_in_either_order() {
        let t0 = Instant::now();
        for first in [true, false] {
            let mut p = Pairing::default();
            assert_eq!(p.seen(seen(SIGINT, first), t0), None);
            let e = p
                .seen(seen(SIGINT, !first), t0 + Duration::from_millis(2))
                .unwrap();
            assert!(e.guard && e.direct);
            assert!(p.expired(t0 + Duration::from_millis(100)).is_empty());
        }
    }

    #[test]
    fn an_unpaired_delivery_is_decided_when_its_window_ends() {
        let t0 = Instant::now();
        let mut p = Pairing::default();
        p.seen(seen(SIGTERM, true), t0);
        assert!(p.expired(t0 + Duration::from_millis(5)).is_empty());
        assert_eq!(p.deadline(), Some(t0 + PAIR_WINDOW));
        let out = p.expired(t0 + PAIR_WINDOW);
        assert_eq!(out.len(), 1);
        assert!(out[0].guard && !out[0].direct);
        // A copy that comes late is the same event, not a second one.
        assert_eq!(
            p.seen(
                seen(SIGTERM, false),
                t0 + PAIR_WINDOW + Duration::from_millis(1)
            ),
            None
        );
        assert!(p.expired(t0 + PAIR_WINDOW * 3).is_empty());
    }

    #[test]
    fn two_relays_of_one_signal_are_one_event() {
        // `timeout` signals the guard, then its group: the guard may take both.
        let t0 = Instant::now();
        let mut p = Pairing::default();
        p.seen(seen(SIGINT, true), t0);
        p.seen(seen(SIGINT, true), t0 + Duration::from_micros(50));
        assert_eq!(p.expired(t0 + PAIR_WINDOW * 2).len(), 1);
    }

    #[test]
    fn different_signals_and_senders_do_not_pair() {
        let t0 = Instant::now();
        let mut p = Pairing::default();
        p.seen(seen(SIGINT, true), t0);
        assert_eq!(p.seen(seen(SIGTERM, false), t0), None);
        let mut other = seen(SIGINT, false);
        other.sender = 78;
        assert_eq!(p.seen(other, t0), None);
        assert_eq!(p.expired(t0 + PAIR_WINDOW).len(), 3);
    }
}
