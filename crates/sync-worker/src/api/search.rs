//! A search's page (`GET .../messages?q=`): the database's full-text index
//! of subject, sender, recipients and preview, and with `body=true` the
//! IMAP server's own `UID SEARCH TEXT` of the bodies, which are not stored
//! (one transient connection, one command per folder searched). Both are
//! merged newest first and paged by one cursor.

use std::collections::HashSet;

use super::accounts::{MessagePage, Search};
use super::errors::imap_failure;
use super::errors::ApiError;
use super::state::ApiState;
use crate::storage::{MessageSummary, SearchCursor};

/// The page of `search` in account `id`, at most `limit` results.
pub(super) async fn search_page(
    state: &ApiState,
    id: &str,
    search: &Search,
    limit: u32,
) -> Result<MessagePage, ApiError> {
    let folder = search.folder.as_deref();
    let mut found = state.storage.search_messages(id, folder, &search.terms, search.after.as_ref(), limit).await?;
    if search.body {
        found.extend(body_matches(state, id, search).await?);
        found.sort_by(|(_, a), (_, b)| (b.date, &b.folder, b.uid).cmp(&(a.date, &a.folder, a.uid)));
        let mut seen = HashSet::new();
        found.retain(|(m, _)| seen.insert(m.id.clone()));
        found.truncate(limit as usize);
    }
    let next_cursor = match found.last() {
        Some((_, last)) if found.len() == limit as usize => Some(last.encode()),
        _ => None,
    };
    let messages: Vec<MessageSummary> = found.into_iter().map(|(m, _)| m).collect();
    Ok(MessagePage { messages, next_cursor, searched_bodies: Some(search.body) })
}

/// The stored messages the server's body search finds, after the cursor.
async fn body_matches(
    state: &ApiState,
    id: &str,
    search: &Search,
) -> Result<Vec<(MessageSummary, SearchCursor)>, ApiError> {
    let folders: Vec<(String, u32)> = state
        .storage
        .folders(id)
        .await?
        .into_iter()
        .filter(|f| search.folder.as_ref().is_none_or(|only| &f.name == only))
        .filter_map(|f| Some((f.name, f.uidvalidity?)))
        .collect();
    if folders.is_empty() {
        return Ok(Vec::new());
    }
    let mut remote = state.remote(id).await?;
    let mut hits = Vec::new();
    let mut failure = None;
    for (folder, uidvalidity) in &folders {
        let uids = match remote.enter(folder, *uidvalidity, false).await {
            Ok(true) => remote.search_text(&search.terms).await,
            Ok(false) => Ok(Vec::new()),
            Err(e) => Err(e),
        };
        match uids {
            Ok(uids) => hits.push((folder.clone(), *uidvalidity, uids)),
            Err(e) => {
                failure = Some(imap_failure(id, &e));
                break;
            }
        }
    }
    remote.close().await;
    if let Some(e) = failure {
        return Err(e);
    }
    let mut found = Vec::new();
    for (folder, uidvalidity, uids) in hits {
        for (m, c) in state.storage.summaries_of(id, &folder, uidvalidity, &uids).await? {
            if search.after.as_ref().is_none_or(|after| c.is_after(after)) {
                found.push((m, c));
            }
        }
    }
    Ok(found)
}
