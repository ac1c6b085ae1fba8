//! The [`TimingsStore`](crate::TimingsStore) contract, for every store
//! (called directly by each backend's tests: a timings store is not part of
//! a [`Fixture`](super::Fixture)). `store` must start empty.

use crate::timings::{PassStreak, TimingsStore};

/// `record` merges (newest duration wins, other units keep theirs), `load`
/// returns every known duration, names with any characters round-trip, and
/// a large record (more than one write chunk) is kept whole.
pub async fn timings_merge_and_round_trip(store: &dyn TimingsStore) {
    assert!(store.load().await.expect("load").is_empty(), "the store must start empty");
    store.record(&[]).await.expect("an empty record");
    store.record(&[("a".into(), 5), ("b \"{x}\" ü".into(), 7)]).await.expect("record");
    store.record(&[("a".into(), 9)]).await.expect("record");
    let loaded = store.load().await.expect("load");
    assert_eq!(loaded.len(), 2, "{loaded:?}");
    assert_eq!(loaded.get("a"), Some(&9));
    assert_eq!(loaded.get("b \"{x}\" ü"), Some(&7));
    let many: Vec<(String, u64)> = (0..2500).map(|i| (format!("t{i}"), i)).collect();
    store.record(&many).await.expect("record many");
    let loaded = store.load().await.expect("load");
    assert_eq!(loaded.len(), 2502);
    assert_eq!(loaded.get("t2499"), Some(&2499));
}

/// `record_outcomes` counts each distinct run once (a run recorded again
/// replaces its outcome), a failure ends a streak, units not named keep
/// theirs, names with any characters round-trip, a large record is kept
/// whole, and streaks never show up among the durations (nor they among
/// the streaks). `store` must start empty.
pub async fn timings_pass_streaks(store: &dyn TimingsStore) {
    assert!(store.load_streaks().await.expect("load_streaks").is_empty(), "the store must start empty");
    store.record_outcomes("b1", &[]).await.expect("an empty record");
    let odd = "b \"{x}\" ü|1 2";
    store.record_outcomes("b1", &[("a".into(), true), (odd.into(), true), ("c".into(), false)]).await.expect("b1");
    store.record_outcomes("b2", &[("a".into(), true), ("c".into(), true)]).await.expect("b2");
    // b2 again (a report made twice): replaced, never counted twice.
    store.record_outcomes("b2", &[("a".into(), true), ("c".into(), true)]).await.expect("b2 again");
    let streaks = store.load_streaks().await.expect("load_streaks");
    assert_eq!(streaks.len(), 3, "{streaks:?}");
    assert_eq!(streaks["a"].passes, 2, "{streaks:?}");
    assert_eq!(streaks["c"].passes, 1, "{streaks:?}");
    assert_eq!(streaks[odd], PassStreak { passes: 1, before: 0, run: "b1".into() }, "{streaks:?}");
    // b2's outcome of `a` replaced by a failure, then b3 passes it again.
    store.record_outcomes("b2", &[("a".into(), false)]).await.expect("b2 replaced");
    assert_eq!(store.load_streaks().await.expect("load_streaks")["a"].passes, 0);
    store.record_outcomes("b3", &[("a".into(), true)]).await.expect("b3");
    let streaks = store.load_streaks().await.expect("load_streaks");
    assert_eq!(streaks["a"], PassStreak { passes: 1, before: 0, run: "b3".into() });
    assert_eq!(streaks["c"].passes, 1, "a unit not named keeps its streak");
    // Durations and streaks are apart.
    assert!(store.load().await.expect("load").is_empty(), "streaks are not durations");
    store.record(&[("a".into(), 5)]).await.expect("record");
    assert_eq!(store.load_streaks().await.expect("load_streaks")["a"].passes, 1);
    let many: Vec<(String, bool)> = (0..2500).map(|i| (format!("t{i}"), i % 2 == 0)).collect();
    store.record_outcomes("b4", &many).await.expect("record many");
    let streaks = store.load_streaks().await.expect("load_streaks");
    assert_eq!(streaks.len(), 2503);
    assert_eq!(streaks["t2498"].passes, 1);
    assert_eq!(streaks["t2499"].passes, 0);
}
