//! The child processes of mpib's tests and tools, started, watched and ended one way.
//!
//! A child is a [`Program`]: a path, its arguments and its environment (the parent's own
//! variables with chosen prefixes removed first, so that a run depends only on what it was
//! given). [`Children`] starts them; their stdout and stderr are read line by line as they
//! come, by one thread per stream, into one channel ([`Children::next`], or one child's
//! next line with [`Children::line_from`]); a line can be written to a child's stdin.
//! [`Children::finish`] waits for every child until a deadline, kills what is left and
//! returns each child's [`Exit`] with everything it printed. A child still running when its
//! [`Children`] is dropped (a test that panicked) is killed.
//!
//! Where a test needs a second process and has a program to start, the program is a binary
//! of its own (`mpib-rank`, `mpib-lifecycle`). The plugin's own integration tests cannot
//! name a binary of another package: they start their own test binary, running one test
//! ([`Program::this_test`]), which learns its role from [`test_child_role`].

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Set in a child started by [`Program::this_test`]: the name of the test it runs. Not an
/// `MPIB_*` name: the plugin warns of `MPIB_*` variables it does not know.
pub const TEST_CHILD_VAR: &str = "TEST_CHILD_ROLE";

/// How long [`Children::finish`] reads what an exited child printed last before it gives up
/// (a grandchild may hold the pipe open).
const DRAIN: Duration = Duration::from_secs(5);

/// A program to start as a child: its path, arguments and environment.
#[derive(Clone, Debug)]
pub struct Program {
    pub path: PathBuf,
    pub args: Vec<String>,
    /// Set in the child, after [`Program::remove_prefixes`] took the parent's away.
    pub env: Vec<(String, String)>,
    /// The parent's variables whose names start with one of these are not passed on.
    pub remove_prefixes: Vec<String>,
}

impl Program {
    pub fn new(path: impl Into<PathBuf>) -> Program {
        Program { path: path.into(), args: Vec::new(), env: Vec::new(), remove_prefixes: Vec::new() }
    }

    /// The running executable (a tool whose `main` checks first whether it was started as a
    /// child).
    pub fn this_program() -> Program {
        Program::new(std::env::current_exe().expect("the running executable's path"))
    }

    /// The running test binary, running only its test `name`, alone, with its output shown
    /// and libtest's own lines kept short (`--exact --nocapture --test-threads=1 -q`: no
    /// "test NAME ... " in front of the test's first line); [`TEST_CHILD_VAR`] is set to
    /// `name`. An `#[ignore]`d test also needs `.arg("--ignored")`.
    pub fn this_test(name: &str) -> Program {
        Program::this_program()
            .args([name, "--exact", "--nocapture", "--test-threads=1", "-q"])
            .env(TEST_CHILD_VAR, name)
    }

    pub fn arg(mut self, a: impl Into<String>) -> Program {
        self.args.push(a.into());
        self
    }

    pub fn args<S: Into<String>>(mut self, a: impl IntoIterator<Item = S>) -> Program {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Program {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn envs<K: Into<String>, V: Into<String>>(mut self, kv: impl IntoIterator<Item = (K, V)>) -> Program {
        self.env.extend(kv.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Passes none of the parent's variables whose names start with `prefix`.
    pub fn remove_prefix(mut self, prefix: &str) -> Program {
        self.remove_prefixes.push(prefix.to_string());
        self
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.path);
        cmd.args(&self.args);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if self.remove_prefixes.iter().any(|p| k.starts_with(p.as_str())) {
                cmd.env_remove(&*k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }
}

/// In a test binary started by [`Program::this_test`]: the name of the test it was started
/// to run. `None` in a normal run.
pub fn test_child_role() -> Option<String> {
    std::env::var(TEST_CHILD_VAR).ok()
}

/// For a test that is only a child's entry point (`#[ignore]`d, started by other tests with
/// [`Program::this_test`]): panics unless this process was started as that child, so that
/// running it on its own fails instead of passing without doing anything.
pub fn expect_test_child(name: &str) {
    if test_child_role().as_deref() != Some(name) {
        panic!(
            "{name} is the child process of other tests, started by them with {TEST_CHILD_VAR}={name}; \
             on its own it has nothing to do"
        );
    }
}

/// Which output a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line a child printed (without its line end).
#[derive(Clone, Debug)]
pub struct Line {
    pub child: usize,
    pub stream: Stream,
    pub text: String,
}

/// How a child ended, and all it printed.
#[derive(Debug, Default)]
pub struct Exit {
    /// `None`: still running at the deadline (then killed), or could not be waited for.
    pub status: Option<ExitStatus>,
    /// Killed by [`Children::finish`] at its deadline.
    pub killed_at_deadline: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Exit {
    /// Exited by itself with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The signal that ended it, if one did.
    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.and_then(|s| s.signal())
    }

    /// Stdout then stderr, for a failure message.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

enum Msg {
    Line(Line),
    Closed,
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    exit: Exit,
    done: bool,
}

/// A group of started children (see the module's description).
pub struct Children {
    procs: Vec<Proc>,
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
    /// Lines received while [`Children::line_from`] waited for another child's.
    pending: VecDeque<Line>,
    open_streams: usize,
}

impl Default for Children {
    fn default() -> Self {
        Self::new()
    }
}

impl Children {
    pub fn new() -> Children {
        let (tx, rx) = mpsc::channel();
        Children { procs: Vec::new(), tx, rx, pending: VecDeque::new(), open_streams: 0 }
    }

    /// Starts `p`; returns its index (0 for the first, then 1, ...).
    pub fn start(&mut self, p: &Program) -> std::io::Result<usize> {
        let mut child = p
            .command()
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("starting {} {:?}: {e}", p.path.display(), p.args)))?;
        let index = self.procs.len();
        read_lines(index, Stream::Stdout, child.stdout.take().expect("piped"), self.tx.clone());
        read_lines(index, Stream::Stderr, child.stderr.take().expect("piped"), self.tx.clone());
        self.open_streams += 2;
        let stdin = child.stdin.take();
        self.procs.push(Proc { child, stdin, exit: Exit::default(), done: false });
        Ok(index)
    }

    /// Starts `p` alone and waits for it (killing it after `timeout`).
    pub fn run(p: &Program, timeout: Duration) -> std::io::Result<Exit> {
        let mut c = Children::new();
        c.start(p)?;
        c.close_stdin(0);
        Ok(c.finish(Instant::now() + timeout).pop().expect("one child"))
    }

    /// The process id of child `i` (to signal it).
    pub fn pid(&self, i: usize) -> u32 {
        self.procs[i].child.id()
    }

    /// What child `i` printed so far (the lines received), stdout then stderr: for a failure
    /// message while it runs.
    pub fn output(&self, i: usize) -> String {
        self.procs[i].exit.output()
    }

    /// Whether some child's stdout or stderr is still open (it may print more).
    pub fn streams_open(&self) -> bool {
        self.open_streams > 0
    }

    /// Writes `line` and a line end to child `i`'s stdin.
    pub fn write_line(&mut self, i: usize, line: &str) -> std::io::Result<()> {
        let stdin = self.procs[i].stdin.as_mut().ok_or_else(|| std::io::Error::other("stdin closed"))?;
        stdin.write_all(format!("{line}\n").as_bytes())?;
        stdin.flush()
    }

    /// Kills child `i` now (SIGKILL) and reaps it; its [`Exit`] comes with the others'.
    pub fn kill(&mut self, i: usize) -> std::io::Result<()> {
        let p = &mut self.procs[i];
        if !p.done {
            p.child.kill()?;
            (p.exit.status, p.done) = (Some(p.child.wait()?), true);
        }
        Ok(())
    }

    /// Closes child `i`'s stdin (it reads the end of its input).
    pub fn close_stdin(&mut self, i: usize) {
        self.procs[i].stdin = None;
    }

    /// The next line of any child; `None` at `until` or once every stream is closed.
    pub fn next(&mut self, until: Instant) -> Option<Line> {
        if let Some(l) = self.pending.pop_front() {
            return Some(l);
        }
        self.receive(until)
    }

    /// The next stdout line of child `i` (other lines stay for [`Children::next`]); `None` at
    /// `until` or when its stdout closed.
    pub fn line_from(&mut self, i: usize, until: Instant) -> Option<String> {
        if let Some(at) = self.pending.iter().position(|l| l.child == i && l.stream == Stream::Stdout) {
            return self.pending.remove(at).map(|l| l.text);
        }
        while let Some(l) = self.receive(until) {
            if l.child == i && l.stream == Stream::Stdout {
                return Some(l.text);
            }
            self.pending.push_back(l);
        }
        None
    }

    /// The next stdout line of child `i` that starts with `prefix`, without it.
    pub fn line_starting(&mut self, i: usize, prefix: &str, until: Instant) -> Option<String> {
        loop {
            let l = self.line_from(i, until)?;
            if let Some(rest) = l.strip_prefix(prefix) {
                return Some(rest.to_string());
            }
        }
    }

    /// One line from the channel, kept in its child's transcript.
    fn receive(&mut self, until: Instant) -> Option<Line> {
        while self.open_streams > 0 {
            let left = until.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(Msg::Line(l)) => {
                    let e = &mut self.procs[l.child].exit;
                    let out = if l.stream == Stream::Stdout { &mut e.stdout } else { &mut e.stderr };
                    out.push_str(&l.text);
                    out.push('\n');
                    return Some(l);
                }
                Ok(Msg::Closed) => self.open_streams -= 1,
                Err(_) => return None,
            }
            if Instant::now() >= until {
                return None;
            }
        }
        None
    }

    /// Waits until `until` for every child to exit, kills those still running, reads what
    /// they printed last; every child's [`Exit`], in the order they were started.
    pub fn finish(mut self, until: Instant) -> Vec<Exit> {
        for p in &mut self.procs {
            p.stdin = None;
        }
        loop {
            let mut running = false;
            for p in self.procs.iter_mut().filter(|p| !p.done) {
                match p.child.try_wait() {
                    Ok(Some(s)) => (p.exit.status, p.done) = (Some(s), true),
                    Ok(None) => running = true,
                    Err(_) => p.done = true,
                }
            }
            if !running || Instant::now() >= until {
                break;
            }
            // Reading meanwhile keeps a child that prints much from blocking on a full pipe.
            let _ = self.receive(Instant::now() + Duration::from_millis(20));
        }
        for p in self.procs.iter_mut().filter(|p| !p.done) {
            let _ = p.child.kill();
            p.exit.status = p.child.wait().ok();
            (p.exit.killed_at_deadline, p.done) = (true, true);
        }
        let drain_until = Instant::now() + DRAIN;
        while self.receive(drain_until).is_some() {}
        self.procs.iter_mut().map(|p| std::mem::take(&mut p.exit)).collect()
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().filter(|p| !p.done) {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

fn read_lines(child: usize, stream: Stream, from: impl Read + Send + 'static, tx: mpsc::Sender<Msg>) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line).trim_end_matches(['\n', '\r']).to_string();
                    if tx.send(Msg::Line(Line { child, stream, text })).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(Msg::Closed);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Program {
        Program::new("/bin/sh").args(["-c", script])
    }

    #[test]
    fn lines_of_each_child_and_its_exit_come_back() {
        let mut c = Children::new();
        c.start(&sh("echo one; echo err >&2; read x; echo got $x; exit 3")).unwrap();
        c.start(&sh("echo two")).unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        assert_eq!(c.line_from(1, until).as_deref(), Some("two"));
        assert_eq!(c.line_from(0, until).as_deref(), Some("one"));
        c.write_line(0, "hello").unwrap();
        assert_eq!(c.line_starting(0, "got ", until).as_deref(), Some("hello"));
        let exits = c.finish(until);
        assert_eq!(exits[0].status.and_then(|s| s.code()), Some(3));
        assert_eq!((exits[0].stdout.as_str(), exits[0].stderr.as_str()), ("one\ngot hello\n", "err\n"));
        assert!(exits[1].success() && !exits[1].killed_at_deadline);
        assert_eq!(exits[1].stdout, "two\n");
    }

    #[test]
    fn a_child_past_the_deadline_is_killed_and_its_output_kept() {
        let e = Children::run(&sh("echo before; exec sleep 30"), Duration::from_millis(300)).unwrap();
        assert!(e.killed_at_deadline && !e.success(), "{e:?}");
        assert_eq!(e.signal(), Some(9));
        assert_eq!(e.stdout, "before\n");
    }

    #[test]
    fn the_parents_variables_of_a_removed_prefix_are_not_passed_on() {
        let home = std::env::var("HOME").expect("HOME is set");
        let p = sh("echo \"[$HOME][$CHILD_PROCS_GIVEN]\"").env("CHILD_PROCS_GIVEN", "given");
        let kept = Children::run(&p, Duration::from_secs(20)).unwrap();
        assert_eq!(kept.stdout, format!("[{home}][given]\n"));
        let removed = Children::run(&p.remove_prefix("HOM"), Duration::from_secs(20)).unwrap();
        assert_eq!(removed.stdout, "[][given]\n", "the given variable stays, the parent's goes");
    }

    #[test]
    fn a_child_entry_run_on_its_own_fails() {
        let r = std::panic::catch_unwind(|| expect_test_child("no_such_role"));
        assert!(r.is_err());
    }
}
