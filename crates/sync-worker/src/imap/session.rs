//! One open connection of an owned account: the per-folder incremental sync
//! and the INBOX watch (see the [module docs](super)).

use std::collections::HashSet;
use std::sync::Arc;

use async_imap::extensions::idle::IdleResponse;
use async_imap::types::{Fetch, Mailbox};
use async_trait::async_trait;
use futures::TryStreamExt;

use super::batch_writer::BatchWriter;
use super::folders::{all_folders, Folder};
use super::message::{flags_of, uid_set, NEW_MAIL_QUERY};
use super::settings::ImapSettings;
use super::transport::ImapSession;
use super::{storage_error, CommandCounts, PollMemory, BATCH, FLAG_RESCAN, FULL_RESCAN_CHUNK};
use crate::errors::{BoxError, SourceError};
use crate::source::{Fence, MailConnection, PollReport, Scope};
use crate::storage::{FolderState, Storage, StorageError};

const INBOX: &str = "INBOX";

/// Most UIDs one `UID SEARCH` covers (see [`Connection::uids_from`]).
const SEARCH_WINDOW: u32 = 50_000;

/// What the server offers, read once per connection.
#[derive(Debug, Clone, Copy, Default)]
struct Caps {
    condstore: bool,
    qresync: bool,
    idle: bool,
    /// RFC 5819: LIST answers STATUS for every folder in one command.
    list_status: bool,
}

/// A folder's counters from a STATUS or a LIST-STATUS answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counters {
    uidvalidity: Option<u32>,
    uidnext: Option<u32>,
    highestmodseq: Option<u64>,
}

impl Counters {
    fn of_attributes(attrs: &[async_imap::imap_proto::StatusAttribute]) -> Self {
        use async_imap::imap_proto::StatusAttribute as A;
        let mut c = Counters::default();
        for a in attrs {
            match a {
                A::UidValidity(v) => c.uidvalidity = Some(*v),
                A::UidNext(n) => c.uidnext = Some(*n),
                A::HighestModSeq(m) => c.highestmodseq = Some(*m),
                _ => {}
            }
        }
        c
    }

    /// Whether they are exactly what storage holds.
    fn unchanged(&self, state: &FolderState) -> bool {
        self.uidvalidity == Some(state.uidvalidity)
            && self.uidnext.is_some()
            && self.uidnext == state.uidnext
            && self.highestmodseq.is_some()
            && self.highestmodseq == state.highestmodseq
    }
}

/// A failure inside one folder's sync.
enum FolderFailure {
    /// The server refused a command for this folder (NO / BAD): skip it.
    Refused(SourceError),
    /// The connection or storage failed: end the poll.
    Fatal(SourceError),
}

impl FolderFailure {
    fn into_error(self) -> SourceError {
        match self {
            FolderFailure::Refused(e) | FolderFailure::Fatal(e) => e,
        }
    }
}

/// Runs one command on the connection's session, bounded by the command
/// timeout: `imap!(conn, "op", |s| s.noop())`.
macro_rules! imap {
    ($conn:expr, $op:expr, |$s:ident| $call:expr) => {{
        let op: String = $op.into();
        $conn.commands.count(&op);
        match $conn.session.take() {
            None => Err(FolderFailure::Fatal($conn.io(op, "the connection was lost earlier".into()))),
            Some(mut $s) => {
                // async-imap queues unsolicited answers in a channel of 100 that drops
                // the rest; nothing here relies on them, so keep it empty.
                while $s.unsolicited_responses.try_recv().is_ok() {}
                let r = tokio::time::timeout($conn.settings.command_timeout, $call).await;
                $conn.finish(op, $s, r)
            }
        }
    }};
}

pub(super) struct Connection {
    commands: Arc<CommandCounts>,
    session: Option<ImapSession>,
    storage: Storage,
    fence: Fence,
    settings: ImapSettings,
    caps: Caps,
    /// The LIST answer's folders (once per connection), and how many
    /// selectable folders the server listed in all.
    folders: Option<(Vec<Folder>, usize)>,
    selected: Option<String>,
    /// Which folder gets the next full flag rescan (servers without
    /// CONDSTORE), and which folders broke the account's last polls.
    memory: Arc<PollMemory>,
    /// The folder (path) whose flags this poll rescans in full.
    full_rescan: Option<String>,
    /// Counters the LIST-STATUS answer gave, by wire name, for the poll that
    /// sent the LIST (a later poll on this connection asks STATUS again).
    listed_status: std::collections::HashMap<String, Counters>,
}

fn is_refusal(e: &async_imap::error::Error) -> bool {
    matches!(e, async_imap::error::Error::No(_) | async_imap::error::Error::Bad(_))
}

/// What one folder's sync did.
#[derive(Debug, Default, Clone, Copy)]
struct FolderReport {
    new_messages: u64,
}

impl Connection {
    pub(super) async fn start(
        session: ImapSession,
        storage: Storage,
        fence: Fence,
        settings: ImapSettings,
        commands: Arc<CommandCounts>,
        memory: Arc<PollMemory>,
    ) -> Result<Self, SourceError> {
        let mut conn = Self {
            commands,
            session: Some(session),
            storage,
            fence,
            settings,
            caps: Caps::default(),
            folders: None,
            selected: None,
            memory,
            full_rescan: None,
            listed_status: Default::default(),
        };
        let caps = imap!(conn, "CAPABILITY", |s| s.capabilities()).map_err(FolderFailure::into_error)?;
        conn.caps = Caps {
            condstore: caps.has_str("CONDSTORE"),
            qresync: caps.has_str("QRESYNC"),
            idle: caps.has_str("IDLE"),
            list_status: caps.has_str("LIST-STATUS"),
        };
        if conn.caps.qresync {
            // RFC 7162: VANISHED answers are only sent once QRESYNC is enabled.
            if imap!(conn, "ENABLE QRESYNC", |s| s.run_command_and_check_ok("ENABLE QRESYNC")).is_err() {
                conn.caps.qresync = false;
                if conn.session.is_none() {
                    return Err(conn.io("ENABLE QRESYNC", "the connection was lost".into()));
                }
            }
        }
        Ok(conn)
    }

    fn io(&self, op: impl Into<String>, source: BoxError) -> SourceError {
        SourceError::Io { account: self.fence.account.clone(), op: op.into(), source }
    }

    fn store_err(&self, e: StorageError) -> FolderFailure {
        FolderFailure::Fatal(storage_error(&self.fence.account, e))
    }

    /// Puts the session back after a command, or drops it: a timeout or a
    /// transport error loses the session (the next call fails at once and the
    /// runner reconnects); a refusal (NO / BAD) keeps it.
    fn finish<T>(
        &mut self,
        op: String,
        session: ImapSession,
        r: Result<async_imap::error::Result<T>, tokio::time::error::Elapsed>,
    ) -> Result<T, FolderFailure> {
        match r {
            Ok(Ok(v)) => {
                self.session = Some(session);
                Ok(v)
            }
            Ok(Err(e)) if is_refusal(&e) => {
                self.session = Some(session);
                Err(FolderFailure::Refused(self.io(op, Box::new(e))))
            }
            Ok(Err(e)) => {
                self.selected = None;
                // A limit, a parse failure or a lost connection in words,
                // never async-imap's dump of the parser's bytes.
                let e = super::transport::imap_error("the answer", e, session.get_ref().limits());
                Err(FolderFailure::Fatal(self.io(op, Box::new(e))))
            }
            Err(_) => {
                self.selected = None;
                let t = self.settings.command_timeout;
                Err(FolderFailure::Fatal(self.io(op, format!("no answer within {t:?}").into())))
            }
        }
    }

    /// Every folder the server lists (LIST once per connection), at most
    /// `max_folders`, and how many it listed in all. Folders storage holds
    /// that the server no longer lists (deleted, or renamed: the new name is
    /// a new folder) are removed here, their messages announced as deleted.
    async fn folders(&mut self) -> Result<(Vec<Folder>, usize), FolderFailure> {
        if let Some(f) = &self.folders {
            return Ok(f.clone());
        }
        // The counters only serve the no-FETCH check, which needs CONDSTORE.
        let with_status = self.caps.list_status && self.caps.condstore;
        let pattern = if with_status { "\"*\" RETURN (STATUS (UIDVALIDITY UIDNEXT HIGHESTMODSEQ))" } else { "*" };
        let (names, statuses) = imap!(self, if with_status { "LIST-STATUS" } else { "LIST" }, |s| async {
            use async_imap::types::UnsolicitedResponse;
            // The STATUS answers arrive among the LIST ones, in async-imap's
            // bounded channel of unsolicited answers: read them as the
            // names come, so none is dropped for lack of room.
            let unsolicited = s.unsolicited_responses.clone();
            let mut statuses = Vec::new();
            let take = |statuses: &mut Vec<(String, Counters)>| {
                while let Ok(r) = unsolicited.try_recv() {
                    if let UnsolicitedResponse::Status { mailbox, attributes } = r {
                        let mailbox = super::folders::unescape_quoted(&mailbox).into_owned();
                        statuses.push((mailbox, Counters::of_attributes(&attributes)));
                    }
                }
            };
            let mut stream = s.list(Some(""), Some(pattern)).await?;
            let mut names = Vec::new();
            while let Some(name) = stream.try_next().await? {
                names.push(name);
                take(&mut statuses);
            }
            take(&mut statuses);
            Ok((names, statuses))
        })?;
        // A STATUS answer the channel dropped anyway is only a STATUS more later.
        self.listed_status = statuses.into_iter().collect();
        let (mut found, total) = all_folders(&names, usize::MAX);
        let account = self.fence.account.clone();
        let stored = self.storage.folder_names(&account).await.map_err(|e| self.store_err(e))?;
        let gone: Vec<&String> = stored.iter().filter(|s| !found.iter().any(|f| &f.path == *s)).collect();
        if !gone.is_empty() {
            let mut tx = self.write().await?;
            for folder in &gone {
                let n = tx.delete_folder(folder).await.map_err(|e| self.store_err(e))?;
                tracing::info!(%account, folder = %folder, messages = n, "folder gone from the server: its rows deleted");
            }
            tx.commit().await.map_err(|e| self.store_err(e))?;
        }
        found.truncate(self.settings.max_folders.max(1));
        tracing::debug!(%account, folders = found.len(), listed = total, "folders");
        self.folders = Some((found.clone(), total));
        Ok((found, total))
    }

    /// A folder name the server gave that cannot go back in a quoted
    /// string (NUL, CR, LF) is refused here, before it reaches the wire.
    fn quotable(&self, op: &str, name: &str) -> Result<(), FolderFailure> {
        super::transport::unquotable("folder name", name)
            .map_err(|e| FolderFailure::Refused(self.io(format!("{op} {}", name.escape_debug()), Box::new(e))))
    }

    async fn select(&mut self, name: &str) -> Result<Mailbox, FolderFailure> {
        self.quotable("SELECT", name)?;
        let condstore = self.caps.condstore;
        // async-imap quotes mailbox names itself.
        let mbox = imap!(self, format!("SELECT {name}"), |s| async {
            if condstore {
                s.select_condstore(name).await
            } else {
                s.select(name).await
            }
        })?;
        self.selected = Some(name.to_string());
        Ok(mbox)
    }

    /// Whether the folder is exactly as storage holds it (STATUS only).
    async fn unchanged(&mut self, name: &str, state: &FolderState) -> Result<bool, FolderFailure> {
        if !self.caps.condstore {
            // Without CONDSTORE a flag change shows in no counter: always look.
            return Ok(false);
        }
        self.quotable("STATUS", name)?;
        // What LIST-STATUS answered for this folder in this poll. (Not for
        // the selected folder, whose counters the server gives from this
        // session's view.)
        let listed = self.listed_status.remove(name);
        if let Some(c) = listed.filter(|_| self.selected.as_deref() != Some(name)) {
            return Ok(c.unchanged(state));
        }
        if self.selected.as_deref() == Some(name) {
            // A server answers STATUS of the selected folder from this
            // session's view, which only a command like NOOP brings up to date.
            imap!(self, format!("NOOP in {name}"), |s| s.noop())?;
        }
        let status = imap!(self, format!("STATUS {name}"), |s| s.status(name, "(UIDNEXT UIDVALIDITY HIGHESTMODSEQ)"))?;
        let c = Counters {
            uidvalidity: status.uid_validity,
            uidnext: status.uid_next,
            highestmodseq: status.highest_modseq,
        };
        Ok(c.unchanged(state))
    }

    async fn write(&self) -> Result<crate::storage::FencedTx, FolderFailure> {
        self.storage.write(&self.fence).await.map_err(|e| self.store_err(e))
    }

    /// One folder's incremental sync.
    async fn sync_folder(&mut self, folder: &Folder) -> Result<FolderReport, FolderFailure> {
        // `name` goes on the wire, `key` (the decoded name) into storage.
        let (name, key) = (folder.name.as_str(), folder.path.as_str());
        let account = self.fence.account.clone();
        let stored = self.storage.folder_state(&account, key).await.map_err(|e| self.store_err(e))?;
        let full_rescan = self.full_rescan.as_deref() == Some(key);
        if let Some(st) = &stored {
            if !full_rescan && self.unchanged(name, st).await? {
                return Ok(FolderReport::default());
            }
        }
        let mbox = self.select(name).await?;
        let Some(uidvalidity) = mbox.uid_validity else {
            // RFC 3501 requires it. A connection cut during the SELECT looks
            // the same (async-imap ends the answer at EOF without an error),
            // so the connection is given up and the poll ends here; this
            // folder then waits at the end of the next polls.
            self.session = None;
            self.selected = None;
            return Err(FolderFailure::Fatal(self.io(
                format!("SELECT {name}"),
                "the answer had no UIDVALIDITY (the connection was cut, or the server is broken)".into(),
            )));
        };
        let mut state = match stored {
            Some(st) if st.uidvalidity == uidvalidity => st,
            previous => {
                let mut tx = self.write().await?;
                tx.ensure_folder(key, folder.role.map(|r| r.as_str())).await.map_err(|e| self.store_err(e))?;
                tx.reset_folder(key, uidvalidity).await.map_err(|e| self.store_err(e))?;
                // Known from the start, so a first sync shows how far it has come.
                tx.set_server_messages(key, mbox.exists).await.map_err(|e| self.store_err(e))?;
                tx.commit().await.map_err(|e| self.store_err(e))?;
                if let Some(p) = previous {
                    tracing::info!(%account, folder = name, old = p.uidvalidity, new = uidvalidity, "UIDVALIDITY changed: folder resynced from scratch");
                }
                FolderState { uidvalidity, last_uid: 0, uidnext: None, highestmodseq: None }
            }
        };
        let old_last = state.last_uid;
        let new_messages = self.fetch_new(folder, &mut state, mbox.uid_next).await?;
        self.sync_flags(folder, &state, old_last, &mbox, full_rescan).await?;
        self.sync_expunges(folder, &state, &mbox).await?;
        // A connection cut mid-answer can end a FETCH stream early without an
        // error; a NOOP answered proves the answers above were whole.
        imap!(self, format!("NOOP in {name}"), |s| s.noop())?;
        // Last: the marks that say everything they cover is stored.
        let uidnext = mbox.uid_next.map(|n| n.max(state.last_uid.saturating_add(1)));
        let mut tx = self.write().await?;
        tx.set_marks(key, uidnext, mbox.highest_modseq).await.map_err(|e| self.store_err(e))?;
        tx.set_server_messages(key, mbox.exists).await.map_err(|e| self.store_err(e))?;
        tx.commit().await.map_err(|e| self.store_err(e))?;
        Ok(FolderReport { new_messages })
    }

    /// The UIDs from `from` on, searched in windows of [`SEARCH_WINDOW`]
    /// UIDs below `uid_next`, so that no answer line passes the reader's
    /// line limit (a `SEARCH` of 50,000 UIDs is at most 550 KB); a folder
    /// whose UIDs fit one window costs one command, as before.
    async fn uids_from(&mut self, name: &str, from: u32, uid_next: Option<u32>) -> Result<Vec<u32>, FolderFailure> {
        let mut found = Vec::new();
        let mut start = from;
        if let Some(next) = uid_next {
            while next.saturating_sub(start) > SEARCH_WINDOW {
                let end = start + (SEARCH_WINDOW - 1);
                let part =
                    imap!(self, format!("UID SEARCH in {name}"), |s| s.uid_search(format!("UID {start}:{end}")))?;
                found.extend(part);
                start = end + 1;
            }
        }
        let part = imap!(self, format!("UID SEARCH in {name}"), |s| s.uid_search(format!("UID {start}:*")))?;
        found.extend(part);
        // `n:*` also matches the highest UID when it is below n: keep only new ones.
        Ok(found.into_iter().filter(|u| *u >= from).collect())
    }

    /// New mail above `state.last_uid`, in batches, one commit each; a
    /// batch is parsed and committed by a [`BatchWriter`] while the next one
    /// is fetched.
    async fn fetch_new(
        &mut self,
        folder: &Folder,
        state: &mut FolderState,
        uid_next: Option<u32>,
    ) -> Result<u64, FolderFailure> {
        let (name, key) = (folder.name.as_str(), folder.path.as_str());
        let from = state.last_uid.saturating_add(1);
        let mut uids = self.uids_from(name, from, uid_next).await?;
        uids.sort_unstable();
        if uids.is_empty() {
            return Ok(0);
        }
        let writer =
            BatchWriter::spawn(self.storage.clone(), self.fence.clone(), key.to_owned(), state.uidvalidity, from);
        let mut failure = None;
        for batch in uids.chunks(BATCH) {
            let set = uid_set(batch);
            let fetched = imap!(self, format!("UID FETCH new mail in {name}"), |s| async {
                let stream = s.uid_fetch(&set, NEW_MAIL_QUERY).await?;
                stream.try_collect::<Vec<Fetch>>().await
            });
            let fetched = match fetched {
                Ok(fetched) => fetched,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            // `last_uid` only moves past UIDs that were answered: a connection
            // that dies mid-stream can end the answer early without an error.
            let got: HashSet<u32> = fetched.iter().filter_map(|f| f.uid).filter(|u| *u >= from).collect();
            let complete = batch.iter().take_while(|u| got.contains(u)).count();
            let last = complete.checked_sub(1).map(|i| batch[i]);
            if !writer.send(fetched, last).await {
                break; // the writer failed: `finish` says why
            }
            if complete < batch.len() {
                // Expunged since the SEARCH, or a cut connection: the next poll
                // searches again from `last_uid` (an expunged UID is not found).
                self.session = None;
                failure = Some(FolderFailure::Fatal(self.io(
                    format!("UID FETCH new mail in {name}"),
                    format!("the server answered {} of {} messages", got.len(), batch.len()).into(),
                )));
                break;
            }
        }
        // What was fetched is committed even when a later FETCH failed; a
        // storage failure (a fence among them) comes first.
        let written = writer.finish().await.map_err(|e| self.store_err(e))?;
        if let Some(last) = written.last_uid {
            state.last_uid = last;
        }
        match failure {
            Some(f) => Err(f),
            None => Ok(written.messages),
        }
    }

    /// Flag changes of messages stored before this poll (`..= old_last`).
    /// Without CONDSTORE the newest [`FLAG_RESCAN`] messages are re-read on
    /// every poll, and every message when `full_rescan` (one folder per
    /// poll takes its turn, so every change arrives eventually).
    async fn sync_flags(
        &mut self,
        folder: &Folder,
        state: &FolderState,
        old_last: u32,
        mbox: &Mailbox,
        full_rescan: bool,
    ) -> Result<(), FolderFailure> {
        let (name, key) = (folder.name.as_str(), folder.path.as_str());
        if old_last == 0 {
            return Ok(());
        }
        let vanished = if self.caps.qresync { " VANISHED" } else { "" };
        let query = match (self.caps.condstore, state.highestmodseq) {
            (true, Some(modseq)) => Some(format!("(UID FLAGS) (CHANGEDSINCE {modseq}{vanished})")),
            // A first sync that was interrupted: its flags may have moved since.
            (true, None) => None,
            (false, _) => None,
        };
        let fetched: Vec<Fetch> = match query {
            Some(q) => {
                let set = format!("1:{old_last}");
                imap!(self, format!("UID FETCH CHANGEDSINCE in {name}"), |s| async {
                    s.uid_fetch(&set, &q).await?.try_collect::<Vec<_>>().await
                })?
            }
            None if self.caps.condstore => {
                let set = format!("1:{old_last}");
                imap!(self, format!("UID FETCH flags in {name}"), |s| async {
                    s.uid_fetch(&set, "(UID FLAGS)").await?.try_collect::<Vec<_>>().await
                })?
            }
            None => {
                if mbox.exists == 0 {
                    return Ok(());
                }
                let first = if full_rescan { 1 } else { mbox.exists.saturating_sub(FLAG_RESCAN - 1).max(1) };
                let mut all = Vec::new();
                let mut start = first;
                // In chunks, so that one answer stays a bounded size.
                while start <= mbox.exists {
                    let end = start.saturating_add(FULL_RESCAN_CHUNK - 1).min(mbox.exists);
                    let set = format!("{start}:{end}");
                    let part: Vec<Fetch> = imap!(self, format!("FETCH flags rescan in {name}"), |s| async {
                        s.fetch(&set, "(UID FLAGS)").await?.try_collect::<Vec<_>>().await
                    })?;
                    all.extend(part);
                    start = end.saturating_add(1);
                    if end == u32::MAX {
                        break;
                    }
                }
                if full_rescan {
                    tracing::debug!(account = %self.fence.account, folder = key, messages = mbox.exists, "full flag rescan");
                }
                all
            }
        };
        let changes: Vec<(u32, String)> =
            fetched.iter().filter_map(|f| f.uid.filter(|u| *u <= old_last).map(|u| (u, flags_of(f)))).collect();
        let gone = self.take_vanished(old_last);
        if changes.is_empty() && gone.is_empty() {
            return Ok(());
        }
        let mut tx = self.write().await?;
        let n = tx.set_flags(key, state.uidvalidity, &changes).await.map_err(|e| self.store_err(e))?;
        let expunged = tx.delete_uids(key, state.uidvalidity, &gone).await.map_err(|e| self.store_err(e))?;
        tx.commit().await.map_err(|e| self.store_err(e))?;
        tracing::debug!(account = %self.fence.account, folder = name, changed = n, expunged, "flags and VANISHED applied");
        Ok(())
    }

    /// The UIDs (up to `up_to`) of the `VANISHED (EARLIER)` answers the last
    /// command left in async-imap's unsolicited channel. That channel drops
    /// what does not fit, so this is a fast path only: the EXISTS count check
    /// of [`Connection::sync_expunges`] catches anything missed.
    fn take_vanished(&mut self, up_to: u32) -> Vec<u32> {
        use async_imap::imap_proto::Response;
        use async_imap::types::UnsolicitedResponse;
        let Some(session) = self.session.as_mut() else { return Vec::new() };
        let mut gone = Vec::new();
        while let Ok(r) = session.unsolicited_responses.try_recv() {
            if let UnsolicitedResponse::Other(data) = r {
                if let Response::Vanished { uids, .. } = data.parsed() {
                    for range in uids {
                        gone.extend(range.clone().filter(|u| *u <= up_to));
                    }
                }
            }
        }
        gone.sort_unstable();
        gone.dedup();
        gone
    }

    /// Deletes stored messages the server no longer has. Storage holding no
    /// more messages below the SELECT's UIDNEXT than its EXISTS proves there
    /// is nothing to do (storage holds every one of them).
    async fn sync_expunges(
        &mut self,
        folder: &Folder,
        state: &FolderState,
        mbox: &Mailbox,
    ) -> Result<(), FolderFailure> {
        let (name, key) = (folder.name.as_str(), folder.path.as_str());
        let account = self.fence.account.clone();
        let below = mbox.uid_next.unwrap_or(u32::MAX);
        let stored: Vec<u32> = self
            .storage
            .stored_uids(&account, key, state.uidvalidity)
            .await
            .map_err(|e| self.store_err(e))?
            .into_iter()
            .filter(|u| *u < below)
            .collect();
        if stored.len() as u64 <= u64::from(mbox.exists) {
            return Ok(());
        }
        let on_server: HashSet<u32> = if below == u32::MAX || below <= SEARCH_WINDOW {
            imap!(self, format!("UID SEARCH ALL in {name}"), |s| s.uid_search("ALL"))?
        } else {
            // A big folder: in windows, so that no answer line passes the limit.
            self.uids_from(name, 1, Some(below)).await?.into_iter().collect()
        };
        let gone: Vec<u32> = stored.into_iter().filter(|u| !on_server.contains(u)).collect();
        if gone.is_empty() {
            return Ok(());
        }
        let mut tx = self.write().await?;
        let n = tx.delete_uids(key, state.uidvalidity, &gone).await.map_err(|e| self.store_err(e))?;
        tx.commit().await.map_err(|e| self.store_err(e))?;
        tracing::debug!(%account, folder = key, expunged = n, "expunges applied");
        Ok(())
    }

    async fn record_inbox(&self) -> Result<(), SourceError> {
        let write = async {
            let mut tx = self.storage.write(&self.fence).await?;
            tx.record_inbox_poll().await?;
            tx.commit().await
        };
        write.await.map_err(|e| storage_error(&self.fence.account, e))
    }

    async fn record(&self, error: Option<&str>) -> Result<(), SourceError> {
        let write = async {
            let mut tx = self.storage.write(&self.fence).await?;
            tx.record_poll(error).await?;
            tx.commit().await
        };
        write.await.map_err(|e| storage_error(&self.fence.account, e))
    }

    /// Makes sure INBOX is the selected folder (IDLE watches the selected one).
    async fn select_inbox(&mut self) -> Result<(), FolderFailure> {
        if self.selected.as_deref() != Some(INBOX) {
            self.select(INBOX).await?;
        }
        Ok(())
    }

    /// Whether INBOX differs from what storage holds: new mail (UIDNEXT), a
    /// reset (UIDVALIDITY) or, on CONDSTORE servers, any change (HIGHESTMODSEQ).
    async fn inbox_changed(&mut self) -> Result<bool, FolderFailure> {
        let account = self.fence.account.clone();
        let stored = self.storage.folder_state(&account, INBOX).await.map_err(|e| self.store_err(e))?;
        // STATUS of the selected folder answers from this session's view: a
        // NOOP first brings it up to date.
        imap!(self, "NOOP in INBOX", |s| s.noop())?;
        let items = if self.caps.condstore { "(UIDNEXT UIDVALIDITY HIGHESTMODSEQ)" } else { "(UIDNEXT UIDVALIDITY)" };
        let status = imap!(self, "STATUS INBOX", |s| s.status(INBOX, items))?;
        let Some(st) = stored else { return Ok(true) };
        Ok(status.uid_next != st.uidnext
            || status.uid_validity != Some(st.uidvalidity)
            || (self.caps.condstore && status.highest_modseq != st.highestmodseq))
    }

    async fn idle_once(&mut self) -> Result<(), SourceError> {
        let Some(session) = self.session.take() else {
            return Err(self.io("IDLE", "the connection was lost earlier".into()));
        };
        self.commands.count("IDLE");
        // The limits stay with the stream; kept here to put IDLE's failures in words.
        let limits = session.get_ref().limits().clone();
        let words = |e| -> crate::errors::BoxError { Box::new(super::transport::imap_error("IDLE", e, &limits)) };
        let mut handle = session.idle();
        let t = self.settings.command_timeout;
        match tokio::time::timeout(t, handle.init()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(self.io("IDLE", words(e))),
            Err(_) => return Err(self.io("IDLE", format!("no answer within {t:?}").into())),
        }
        let outcome = {
            let (wait, _stop) = handle.wait_with_timeout(self.settings.idle_silence);
            // Our own hard deadline: async-imap's timer restarts at every keepalive.
            tokio::time::timeout(self.settings.idle_deadline, wait).await
        };
        let silent = matches!(outcome, Ok(Ok(IdleResponse::Timeout)));
        if let Ok(Err(e)) = outcome {
            return Err(self.io("IDLE", words(e)));
        }
        // DONE must be answered in time: after a long silence this is the
        // proof that the connection is alive.
        match tokio::time::timeout(t, handle.done()).await {
            Ok(Ok(session)) => {
                self.session = Some(session);
                Ok(())
            }
            Ok(Err(e)) => Err(self.io("IDLE DONE", words(e))),
            Err(_) => Err(self.io(
                "IDLE DONE",
                if silent {
                    format!("the server was silent for {:?} and did not answer DONE", self.settings.idle_silence).into()
                } else {
                    format!("no answer within {t:?}").into()
                },
            )),
        }
    }
}

#[async_trait]
impl MailConnection for Connection {
    async fn poll(&mut self, scope: Scope) -> Result<PollReport, SourceError> {
        let mut refused = Vec::new();
        let folders = if scope == Scope::Inbox {
            vec![Folder::new(INBOX, None)]
        } else {
            let (mut folders, listed) = self.folders().await.map_err(FolderFailure::into_error)?;
            self.memory.broken_last(&self.fence.account, &mut folders);
            if listed > folders.len() {
                let limit = folders.len();
                tracing::warn!(account = %self.fence.account, listed, limit, "more folders than IMAP_MAX_FOLDERS: the rest are not synced");
                refused.push(format!(
                    "the server lists {listed} folders; only the first {limit} are synced (IMAP_MAX_FOLDERS)"
                ));
            }
            // One folder per poll has its flags rescanned in full when the
            // server cannot say what changed (no CONDSTORE).
            self.full_rescan = (!self.caps.condstore)
                .then(|| folders[self.memory.next_rescan(&self.fence.account, folders.len())].path.clone());
            folders
        };
        let mut report = PollReport::default();
        for folder in &folders {
            match self.sync_folder(folder).await {
                Ok(r) => {
                    report.new_messages += r.new_messages;
                    self.memory.synced(&self.fence.account, &folder.path);
                }
                Err(FolderFailure::Refused(e)) => {
                    // One folder the server refuses never stops the others.
                    tracing::warn!(account = %self.fence.account, folder = %folder.name, error = %crate::errors::error_chain(&e), "folder skipped");
                    refused.push(crate::errors::error_chain(&e));
                }
                Err(FolderFailure::Fatal(e)) => {
                    // The connection broke in this folder (storage failures
                    // are the database's, not the folder's).
                    if matches!(e, SourceError::Io { .. }) {
                        self.memory.broke(&self.fence.account, &folder.path);
                    }
                    if !matches!(e, SourceError::Fenced { .. }) {
                        // Best effort: a failed write of the error must not hide the error.
                        let _ = self.record(Some(&crate::errors::error_chain(&e))).await;
                    }
                    return Err(e);
                }
            }
        }
        // LIST-STATUS counters serve the poll whose LIST they came with only.
        self.listed_status.clear();
        let error = (!refused.is_empty()).then(|| refused.join("; "));
        match (scope, error) {
            // INBOX alone is not a sync of the account: before its first whole
            // sync has finished, "last sync" stays unset.
            (Scope::Inbox, None) => self.record_inbox().await?,
            (_, error) => self.record(error.as_deref()).await?,
        }
        let account = self.fence.account.clone();
        report.latest_internal_date_ms = self
            .storage
            .latest_internal_date(&account)
            .await
            .map_err(|e| storage_error(&account, e))?
            .map(|m| m.max(0) as u64);
        Ok(report)
    }

    async fn wait_new_mail(&mut self) -> Result<(), SourceError> {
        if !self.caps.idle {
            tokio::time::sleep(self.settings.noop_interval).await;
            return imap!(self, "NOOP", |s| s.noop()).map_err(FolderFailure::into_error);
        }
        self.select_inbox().await.map_err(FolderFailure::into_error)?;
        // Mail that arrived between the last FETCH and now, or a reset or a
        // change missed while IDLE was being (re-)issued: no IDLE needed.
        if self.inbox_changed().await.map_err(FolderFailure::into_error)? {
            return Ok(());
        }
        self.idle_once().await
    }
}
