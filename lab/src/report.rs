//! What the experiments' reports share: a line written to a text report, a table printed a
//! row at a time, and a spread over runs in a JSON object (docs/cli.md, *Output conventions*).

use crate::harness::Spread;

/// Writes a line to a `String` report, as `writeln!` would (a `String` takes every write):
/// `say!(out)` an empty line, `say!(out, "…", …)` a formatted one.
macro_rules! say {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}
pub(crate) use say;

/// Seconds as a report prints a time: in the unit that suits it (`testbed::workload::human`);
/// a negative time as none.
pub fn seconds(s: f64) -> String {
    testbed::workload::human(std::time::Duration::from_secs_f64(s.max(0.0)))
}

/// A link driver's name, as reports and `--driver` spell it.
pub fn driver_name(driver: link::driver::DriverKind) -> &'static str {
    if driver == link::driver::DriverKind::IoUring { "io_uring" } else { "portable" }
}

/// A spread over runs into the object `v`, as every command gives one (docs/cli.md): the
/// median under `key`, its bounds under `key_min` and `key_max`. Nothing where `v` is not an
/// object.
pub fn spread(v: &mut serde_json::Value, key: &str, s: Spread) {
    if let Some(m) = v.as_object_mut() {
        m.insert(key.to_string(), s.median.into());
        m.insert(format!("{key}_min"), s.min.into());
        m.insert(format!("{key}_max"), s.max.into());
    }
}

/// One line of a table printed a row at a time, as a long measurement produces its rows (the
/// benches' reports): the first cell, text, left-aligned in its width, the others aligned
/// right in theirs, one space apart; a row may have fewer cells than the widths.
pub fn row(widths: &[usize], cells: &[String]) -> String {
    let mut s = String::new();
    for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
        let pad = w.saturating_sub(c.chars().count());
        if i == 0 {
            s.push_str(c);
            s.push_str(&" ".repeat(pad));
        } else {
            s.push(' ');
            s.push_str(&" ".repeat(pad));
            s.push_str(c);
        }
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_row_pads_its_label_left_and_its_figures_right() {
        let w = [12, 6, 6];
        assert_eq!(row(&w, &["bare".into(), "7.5".into(), "1.00".into()]), "bare            7.5   1.00");
        assert_eq!(row(&w, &["a label too long".into(), "1".into()]), "a label too long      1");
        assert_eq!(row(&w, &["x".into()]), "x");
    }

    #[test]
    fn a_spread_gives_its_median_and_bounds_and_leaves_a_non_object_alone() {
        let s = Spread { median: 2.0, min: 1.0, max: 3.0 };
        let mut v = serde_json::json!({});
        spread(&mut v, "x", s);
        assert_eq!(v, serde_json::json!({"x": 2.0, "x_min": 1.0, "x_max": 3.0}));
        let mut n = serde_json::json!(1);
        spread(&mut n, "x", s);
        assert_eq!(n, serde_json::json!(1));
    }
}
