//! End-to-end test of the HTML timeline (`hopper run --html`) in a real
//! browser: Debian's headless `chromium` loads the page, runs its script, and
//! both the DOM it dumps and its screenshot must show every attempt as a bar
//! in its outcome's colour.
//!
//! A missing `chromium` fails this test (`cargo xtask setup` installs it); it
//! never skips it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{hopper, texts, Suite};

/// The colours of the bars, as the page draws them (`BarKind::colour`).
const PASSED: [u8; 3] = [0x2c, 0xa0, 0x2c];
const FLAKY: [u8; 3] = [0x94, 0x67, 0xbd];
const RETRIED: [u8; 3] = [0xff, 0x7f, 0x0e];
const FAILED: [u8; 3] = [0xd6, 0x27, 0x28];

/// Runs headless chromium with a fresh profile on `page` plus `args`; fails
/// the test when chromium is missing or hangs.
fn chromium(page: &Path, args: &[&str]) -> Output {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1200,800",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("this test needs Debian's chromium (`apt-get install -y chromium`, or `cargo xtask setup`): {e}")
        });
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "chromium failed: {}", String::from_utf8_lossy(&output.stderr));
    output
}

/// Pixels of the screenshot at `path` exactly `colour`.
fn pixels_of(path: &Path, colour: [u8; 3]) -> usize {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    buf[..info.buffer_size()].chunks_exact(channels).filter(|px| px[..3] == colour).count()
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// Where the screenshot is kept after the test, for a person to look at.
fn kept_screenshot() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hopper-timeline.png")
}

#[test]
fn the_timeline_shows_every_attempt_in_its_outcome_colour_in_chromium() {
    let mut suite = Suite::new();
    for (i, secs) in [0.6, 0.4, 0.5, 0.3, 0.7, 0.4].iter().enumerate() {
        suite.slow(&format!("pass_{i}.sh"), *secs);
    }
    suite.unit("fail.sh", "sleep 0.4\necho 'assertion failed: expected 1, got 2' >&2\nexit 1\n");
    let marker = suite.path().join("flaky.marker");
    suite.unit(
        "flaky.sh",
        &format!(
            "sleep 0.4\nif [ -e '{m}' ]; then exit 0; fi\ntouch '{m}'\necho 'flake: first attempt fails' >&2\nexit 1\n",
            m = marker.display()
        ),
    );
    let list = suite.unit_list();
    let page = suite.path().join("timeline.html");
    let output = hopper(suite.path())
        .args(["run", "-j", "2", "--max-requeues", "1", "--no-timings", "--units-from"])
        .arg(&list)
        .arg("--html")
        .arg(&page)
        .args(["--", "sh"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("HTML timeline written to"), "{stdout}");

    let html = std::fs::read_to_string(&page).unwrap();
    for network in ["<link", "src=\"http", "href=\"http", "url(http", "@import"] {
        assert!(!html.contains(network), "the page must be self-contained, found {network:?}");
    }
    let fail = suite.unit_name("fail.sh");
    assert!(html.contains("assertion failed: expected 1, got 2"), "the failure's output is on the page");
    assert!(html.contains(&format!("<code>{fail}</code>")), "the failed unit is named");
    assert!(html.contains("id=\"slowest\"") && html.contains("id=\"flaky\"") && html.contains("idle-at-end"));

    // The DOM after the script ran: one bar per attempt, of the right kind.
    let dom = String::from_utf8(chromium(&page, &["--dump-dom"]).stdout).unwrap();
    assert_eq!(count(&dom, "class=\"bar passed\""), 6, "six units passed at once");
    assert_eq!(count(&dom, "class=\"bar flaky\""), 1, "flaky.sh passed on its retry");
    assert_eq!(count(&dom, "class=\"bar retried\""), 2, "fail.sh and flaky.sh failed once and were retried");
    assert_eq!(count(&dom, "class=\"bar failed\""), 1, "fail.sh failed on its retry too");
    assert_eq!(count(&dom, "class=\"lane-label\""), 2, "-j 2: two lanes");

    // The screenshot: the bars are drawn, in their colours. The legend and
    // the verdict use the same colours, so the same page without its drawing
    // script (no bars) is the baseline.
    let dir = tempfile::tempdir().unwrap();
    let (shot, bare) = (dir.path().join("timeline.png"), dir.path().join("bare.png"));
    chromium(&page, &[&format!("--screenshot={}", shot.display())]);
    let script_at = html.rfind("<script>").expect("the drawing script");
    let bare_page = dir.path().join("bare.html");
    std::fs::write(&bare_page, format!("{}</body></html>", &html[..script_at])).unwrap();
    chromium(&bare_page, &[&format!("--screenshot={}", bare.display())]);
    std::fs::copy(&shot, kept_screenshot()).unwrap();
    // A bar is 18 px high; each of these is at least 10 px wide at 1200 px.
    for (name, colour, bars) in
        [("passed", PASSED, 6), ("flaky", FLAKY, 1), ("retried", RETRIED, 2), ("failed", FAILED, 1)]
    {
        let drawn = pixels_of(&shot, colour).saturating_sub(pixels_of(&bare, colour));
        assert!(
            drawn >= bars * 18 * 10,
            "{name}: only {drawn} more pixels of its colour with the script than without (screenshot {})",
            kept_screenshot().display()
        );
    }
}
