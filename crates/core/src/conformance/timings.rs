//! The [`TimingsStore`](crate::TimingsStore) contract, for every store
//! (called directly by each backend's tests: a timings store is not part of
//! a [`Fixture`](super::Fixture)). `store` must start empty.

use crate::timings::TimingsStore;

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
