//! Progress bars on stderr for long work; hidden when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Bar(ProgressBar);

impl Bar {
    pub fn bytes(label: &str) -> Bar {
        Bar::styled(
            label,
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
    }

    pub fn count(label: &str) -> Bar {
        Bar::styled(label, "{msg} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
    }

    /// Lines of a batch: done of total, and a message of what else to say.
    pub fn lines(total: u64) -> Bar {
        let bar = Bar::styled(
            "lines",
            "{msg:<10} [{bar:30}] {pos}/{len} eta {eta} · {prefix}",
        );
        bar.0.set_length(total);
        bar
    }

    /// Moves the bar to `pos`, saying `note` beside it.
    pub fn set(&self, pos: u64, note: String) {
        self.0.set_position(pos);
        self.0.set_prefix(note);
    }

    pub fn finish(&self) {
        self.0.finish_and_clear();
    }

    fn styled(label: &str, template: &str) -> Bar {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message(label.to_owned());
        Bar(bar)
    }
}

impl frugal_cost::Progress for Bar {
    fn start(&self, total: u64) {
        self.0.set_length(total);
    }

    fn advance(&self, delta: u64) {
        self.0.inc(delta);
    }

    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

impl frugal_engine::quantize::QuantizeProgress for Bar {
    fn start(&self, total_bytes: u64) {
        self.0.set_length(total_bytes);
    }

    fn tensor_done(&self, _name: &str, bytes: u64) {
        self.0.inc(bytes);
    }
}
