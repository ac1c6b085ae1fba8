//! What a source remembers of each account from one poll to the next (a
//! warm account's connections last one poll each): whose turn it is for a
//! full flag rescan, and which folders ended a poll by breaking it.
//!
//! A folder whose sync ends the poll (the server drops the connection in
//! it, or stops answering) goes last in the account's next polls, until it
//! syncs again: folder order is fixed, so otherwise one broken folder would
//! keep every folder after it from syncing for good.

use std::collections::HashMap;

use leasehold_core::LeaseKey;
use parking_lot::Mutex;

use super::folders::Folder;

/// Per-account memory of the polls, kept by the source.
#[derive(Debug, Default)]
pub struct PollMemory {
    rescan_turns: Mutex<HashMap<LeaseKey, usize>>,
    /// Folder paths, in the order they broke.
    broken: Mutex<HashMap<LeaseKey, Vec<String>>>,
}

impl PollMemory {
    /// The index (below `folders`) of the folder to rescan in this poll; the
    /// next call answers the one after it.
    pub(super) fn next_rescan(&self, account: &LeaseKey, folders: usize) -> usize {
        let mut turns = self.rescan_turns.lock();
        let turn = turns.entry(account.clone()).or_default();
        let now = *turn % folders.max(1);
        *turn = now + 1;
        now
    }

    /// Moves the folders that broke a poll of `account` to the end of
    /// `folders`, in the order they broke; the others keep their order.
    pub(super) fn broken_last(&self, account: &LeaseKey, folders: &mut Vec<Folder>) {
        let broken = self.broken.lock();
        let Some(paths) = broken.get(account) else { return };
        let (mut last, rest): (Vec<Folder>, Vec<Folder>) =
            std::mem::take(folders).into_iter().partition(|f| paths.contains(&f.path));
        last.sort_by_key(|f| paths.iter().position(|p| p == &f.path));
        *folders = rest;
        folders.extend(last);
    }

    /// `path` ended a poll of `account`.
    pub(super) fn broke(&self, account: &LeaseKey, path: &str) {
        let mut broken = self.broken.lock();
        let paths = broken.entry(account.clone()).or_default();
        paths.retain(|p| p != path);
        paths.push(path.to_owned());
    }

    /// `path` synced: it takes its usual place again.
    pub(super) fn synced(&self, account: &LeaseKey, path: &str) {
        let mut broken = self.broken.lock();
        if let Some(paths) = broken.get_mut(account) {
            paths.retain(|p| p != path);
            if paths.is_empty() {
                broken.remove(account);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(folders: &[Folder]) -> Vec<&str> {
        folders.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn broken_folders_go_last_in_the_order_they_broke_until_they_sync() {
        let memory = PollMemory::default();
        let (a, b) = (LeaseKey::new("a").unwrap(), LeaseKey::new("b").unwrap());
        let listed = || ["INBOX", "Aaa", "Bbb", "Ccc"].map(|n| Folder::new(n, None)).to_vec();
        memory.broke(&a, "Bbb");
        memory.broke(&a, "Aaa");
        let mut folders = listed();
        memory.broken_last(&a, &mut folders);
        assert_eq!(names(&folders), ["INBOX", "Ccc", "Bbb", "Aaa"]);
        let mut other = listed();
        memory.broken_last(&b, &mut other);
        assert_eq!(names(&other), ["INBOX", "Aaa", "Bbb", "Ccc"], "another account's order is its own");
        memory.synced(&a, "Bbb");
        memory.broke(&a, "Aaa");
        let mut folders = listed();
        memory.broken_last(&a, &mut folders);
        assert_eq!(names(&folders), ["INBOX", "Bbb", "Ccc", "Aaa"]);
    }

    #[test]
    fn the_rescan_takes_each_folder_in_turn() {
        let memory = PollMemory::default();
        let a = LeaseKey::new("a").unwrap();
        let turns: Vec<usize> = (0..5).map(|_| memory.next_rescan(&a, 3)).collect();
        assert_eq!(turns, [0, 1, 2, 0, 1]);
    }
}
