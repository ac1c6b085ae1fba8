//! Lists the conformance cases, so the suite cannot miss one: every public
//! `async fn NAME(fx: Fixture)` in a case file under `src/conformance/` is a
//! case, and `conformance_suite!` expands to one test per case found here.
//! A public async fn of a case file that is not a case fails the build.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Files of the kit that hold no cases.
const NOT_CASES: [&str; 3] = ["mod.rs", "support.rs", "timings.rs"];

fn main() {
    let root = Path::new("src/conformance");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    collect(root, &mut files);
    files.sort();
    let mut cases = String::new();
    let mut count = 0;
    for file in &files {
        let module = module_path(root, file);
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        for (n, line) in text.lines().enumerate() {
            let Some(rest) = line.strip_prefix("pub async fn ") else { continue };
            let name = rest.split('(').next().unwrap_or_default();
            let takes_fixture = rest.contains("(fx: Fixture)") || rest.contains("(_fx: Fixture)");
            if !takes_fixture || name.is_empty() {
                panic!(
                    "{}:{}: `pub async fn {name}` in a conformance case file is not a case: a case is \
                     `pub async fn NAME(fx: Fixture)`; make helpers private or move them to support.rs",
                    file.display(),
                    n + 1
                );
            }
            writeln!(cases, "        $crate::__conformance_case!($backend, {name}, {module});")
                .expect("write to a String");
            count += 1;
        }
    }
    assert!(count > 0, "no conformance cases found under {}", root.display());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let generated = format!(
        "/// Expands to one `#[tokio::test]` per conformance case ({count} cases), each\n\
         /// on a fresh fixture from `$backend` (an expression evaluated once per test).\n\
         #[macro_export]\n\
         macro_rules! conformance_suite {{\n    ($backend:expr) => {{\n{cases}    }};\n}}\n"
    );
    std::fs::write(out.join("conformance_cases.rs"), generated).expect("write the conformance case list");
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !NOT_CASES.iter().any(|n| path.file_name().is_some_and(|f| f == *n))
        {
            files.push(path);
        }
    }
}

/// `src/conformance/queue/reserve.rs` → `queue::reserve`.
fn module_path(root: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(root).expect("a file under the root").with_extension("");
    relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("::")
}
