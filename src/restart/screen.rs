//! Where a workload run's progress goes. On a terminal: one status line,
//! redrawn in place, under the lines that stay. Elsewhere (a file, a pipe,
//! a CI log): plain lines, and a `progress:` line each time the Pods done
//! or the wave move on, not every second.

use std::io::{self, Write};

/// Erases the terminal line the cursor is on and goes to its start.
const REDRAW: &str = "\r\x1b[2K";

#[derive(Debug)]
pub struct Screen {
    live: bool,
    /// The status last shown.
    status: Option<String>,
    /// Closed: the status line is not drawn again.
    closed: bool,
}

impl Screen {
    pub fn new(live: bool) -> Self {
        Self {
            live,
            status: None,
            closed: false,
        }
    }

    /// Prints `line` to stay, and after it `status` (a live line, or a
    /// plain `progress:` line if its first two parts changed).
    pub fn say(
        &mut self,
        out: &mut (dyn Write + Send),
        line: &str,
        status: &str,
    ) -> io::Result<()> {
        if self.live {
            out.write_all(format!("{REDRAW}{line}\n").as_bytes())?;
            self.status = None;
            return self.refresh(out, status);
        }
        out.write_all(format!("{line}\n").as_bytes())?;
        let head = |s: &str| s.split(", ").take(2).map(str::to_owned).collect::<Vec<_>>();
        if self.status.as_deref().map(head) != Some(head(status)) {
            out.write_all(format!("progress: {status}\n").as_bytes())?;
            self.status = Some(status.to_owned());
        }
        out.flush()
    }

    /// Redraws the live status line (the elapsed time moves on).
    pub fn refresh(&mut self, out: &mut (dyn Write + Send), status: &str) -> io::Result<()> {
        if !self.live || self.closed {
            return Ok(());
        }
        out.write_all(format!("{REDRAW}{status}").as_bytes())?;
        self.status = Some(status.to_owned());
        out.flush()
    }

    /// From now on only lines that stay: the run is over, or interrupted.
    pub fn close(&mut self) {
        self.closed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_output_says_progress_only_when_pods_or_the_wave_move_on() {
        let mut screen = Screen::new(false);
        let mut out = Vec::new();
        screen
            .say(
                &mut out,
                "wave 1: a",
                "Pods 0/2 done, wave 1 (1 Pod), 0.0s elapsed",
            )
            .unwrap();
        screen
            .say(
                &mut out,
                "waiting",
                "Pods 0/2 done, wave 1 (1 Pod), 0.4s elapsed",
            )
            .unwrap();
        screen
            .say(
                &mut out,
                "a: restarted",
                "Pods 1/2 done, wave 1 (1 Pod), 1.2s elapsed",
            )
            .unwrap();
        screen
            .refresh(&mut out, "Pods 1/2 done, wave 1 (1 Pod), 2.0s elapsed")
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "wave 1: a\nprogress: Pods 0/2 done, wave 1 (1 Pod), 0.0s elapsed\nwaiting\n\
             a: restarted\nprogress: Pods 1/2 done, wave 1 (1 Pod), 1.2s elapsed\n"
        );
    }

    #[test]
    fn a_terminal_gets_one_line_redrawn_until_closed() {
        let mut screen = Screen::new(true);
        let mut out = Vec::new();
        screen.say(&mut out, "wave 1: a", "Pods 0/1 done").unwrap();
        screen.refresh(&mut out, "Pods 0/1 done, 1.0s").unwrap();
        screen.close();
        screen.say(&mut out, "done", "Pods 1/1 done").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\r\x1b[2Kwave 1: a\n\r\x1b[2KPods 0/1 done\r\x1b[2KPods 0/1 done, 1.0s\r\x1b[2Kdone\n"
        );
    }
}
