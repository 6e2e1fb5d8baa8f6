//! A table as every dxpu command prints one (docs/cli.md, *Output conventions*): `dxpu ctl`'s
//! answers, `dxpu pool ls`, `dxpu bench pool`.

/// A table as every dxpu command prints one (docs/cli.md, *Output conventions*): the header in
/// capitals, columns two spaces apart and as wide as their widest cell, numbers aligned right
/// and text left, `-` for a value that is absent.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    // A column is numeric when it holds a number and nothing else but `-`.
    let mut numeric = vec![true; header.len()];
    let mut a_number = vec![false; header.len()];
    for r in rows {
        for (i, c) in r.iter().enumerate().take(header.len()) {
            width[i] = width[i].max(c.chars().count());
            let number = c.parse::<f64>().is_ok();
            numeric[i] &= c == "-" || number;
            a_number[i] |= number;
        }
    }
    for (n, a) in numeric.iter_mut().zip(&a_number) {
        *n &= *a;
    }
    let line = |cells: &mut dyn Iterator<Item = String>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate().take(header.len()) {
            let pad = width[i].saturating_sub(c.chars().count());
            if numeric[i] {
                s.push_str(&" ".repeat(pad));
                s.push_str(&c);
            } else {
                s.push_str(&c);
                s.push_str(&" ".repeat(pad));
            }
            s.push_str("  ");
        }
        s.trim_end().to_string() + "\n"
    };
    // One word per column, so that a header splits as its rows do (`awk`, `column -t`).
    let mut out = line(&mut header.iter().map(|h| h.to_uppercase().replace(' ', "-")));
    for r in rows {
        out.push_str(&line(&mut r.iter().cloned()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_a_capital_header_and_aligns_numbers_right_and_text_left() {
        let rows = vec![
            vec!["box-a".to_string(), "12".to_string(), "-".to_string()],
            vec!["b".to_string(), "3.5".to_string(), "gpu0".to_string()],
        ];
        let t = table(&["box", "claims/s", "device"], &rows);
        assert_eq!(t, "BOX    CLAIMS/S  DEVICE\nbox-a        12  -\nb           3.5  gpu0\n", "{t}");
        // A column of nothing but `-` is text.
        assert_eq!(table(&["owner", "n"], &[vec!["-".into(), "1".into()]]), "OWNER  N\n-      1\n");
        // A header alone, and a row shorter or longer than the header.
        assert_eq!(table(&["a", "b"], &[]), "A  B\n");
        assert_eq!(table(&["p50 ms", "n"], &[]), "P50-MS  N\n");
        let t = table(&["a", "b"], &[vec!["x".into()], vec!["y".into(), "z".into(), "extra".into()]]);
        assert_eq!(t, "A  B\nx\ny  z\n", "{t}");
    }
}
