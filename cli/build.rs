//! Names the commit the binary was built from (`dxpu --version`), where it is built from a
//! git checkout; `unknown` otherwise (a source tarball).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    println!("cargo:rustc-env=DXPU_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
    // Built again when HEAD moves: HEAD itself (a checkout) and the branch it names (a commit;
    // a branch only in packed-refs is not watched: a missing file would rerun every build).
    println!("cargo:rerun-if-changed=build.rs");
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])),
    ]
    .into_iter()
    .flatten()
    .filter(|p| std::path::Path::new(p).exists())
    {
        println!("cargo:rerun-if-changed={path}");
    }
}
