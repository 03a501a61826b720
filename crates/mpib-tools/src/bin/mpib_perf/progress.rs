//! What the tool prints while the ranks run: a progress line on a terminal once the run
//! has taken a few seconds (never when stdout is not a terminal), and `TIMELINE-START
//! <ns>` the moment the sender starts the measured stream of a `--timeline` run (always:
//! scripts wait for it).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use mpib_tools::rank::PhaseStart;

/// After this long a run gets a progress line.
const QUIET_FOR: Duration = Duration::from_secs(2);

pub struct Progress {
    start: Instant,
    show: bool,
    shown: bool,
    sizes: Vec<u64>,
    timeline: bool,
}

impl Progress {
    pub fn new(sizes: &[u64], quiet: bool, timeline: bool) -> Progress {
        let show = !quiet && std::io::stdout().is_terminal();
        Progress { start: Instant::now(), show, shown: false, sizes: sizes.to_vec(), timeline }
    }

    /// A rank started a phase; `sender`: it is the rank that sends (rank 1).
    pub fn phase(&mut self, sender: bool, p: &PhaseStart) {
        let mut out = std::io::stdout().lock();
        if self.timeline && sender && !p.warmup {
            self.clear(&mut out);
            let _ = writeln!(out, "TIMELINE-START {}", p.at_ns);
        }
        if self.show && self.start.elapsed() >= QUIET_FOR {
            let size = self.sizes.get(p.index).copied().unwrap_or(0);
            let what = if p.warmup { "warm-up" } else { "measuring" };
            let _ = write!(
                out,
                "\r\x1b[K[{}/{}] {} bytes: {what}, {} messages ({:.0} s so far)",
                p.index + 1,
                self.sizes.len(),
                size,
                p.count,
                self.start.elapsed().as_secs_f64()
            );
            self.shown = true;
        }
        let _ = out.flush();
    }

    fn clear(&mut self, out: &mut impl Write) {
        if self.shown {
            let _ = write!(out, "\r\x1b[K");
            self.shown = false;
        }
    }

    /// Removes the progress line (before the table).
    pub fn done(&mut self) {
        let mut out = std::io::stdout().lock();
        self.clear(&mut out);
        let _ = out.flush();
    }
}
