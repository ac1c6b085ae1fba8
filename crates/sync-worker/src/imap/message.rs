//! One FETCH answer into one stored row: flags, dates and size from IMAP,
//! subject, addresses and a short preview parsed by mail-parser from the
//! header and the start of the text.

use async_imap::types::{Fetch, Flag};
use mail_parser::{Address, MessageParser};

use crate::storage::MessageRow;

/// What new mail is fetched with: the attributes, the header, and the first
/// bytes of the text (enough for a preview, bounded whatever the size).
pub(crate) const NEW_MAIL_QUERY: &str =
    "(UID FLAGS INTERNALDATE RFC822.SIZE ENVELOPE BODY.PEEK[HEADER] BODY.PEEK[TEXT]<0.4096>)";

/// Longest preview kept, in characters.
const PREVIEW_CHARS: usize = 200;

/// The flags of a FETCH answer, as stored: sorted, space-separated.
pub(crate) fn flags_of(fetch: &Fetch) -> String {
    let mut flags: Vec<String> = fetch
        .flags()
        .filter_map(|f| match f {
            Flag::Seen => Some("\\Seen".to_string()),
            Flag::Answered => Some("\\Answered".to_string()),
            Flag::Flagged => Some("\\Flagged".to_string()),
            Flag::Deleted => Some("\\Deleted".to_string()),
            Flag::Draft => Some("\\Draft".to_string()),
            // \Recent is per session, not a property of the message.
            Flag::Recent | Flag::MayCreate => None,
            Flag::Custom(c) => Some(c.to_string()),
        })
        .collect();
    flags.sort();
    flags.dedup();
    flags.join(" ")
}

fn first_address(a: Option<&Address<'_>>) -> Option<String> {
    let addr = a?.first()?;
    match (addr.name(), addr.address()) {
        (Some(n), Some(e)) => Some(format!("{n} <{e}>")),
        (None, Some(e)) => Some(e.to_string()),
        (Some(n), None) => Some(n.to_string()),
        (None, None) => None,
    }
}

fn all_addresses(a: Option<&Address<'_>>) -> Option<String> {
    let list: Vec<String> = a?.iter().filter_map(|x| x.address().map(str::to_string)).collect();
    (!list.is_empty()).then(|| list.join(", "))
}

/// The row for a FETCH answer of [`NEW_MAIL_QUERY`]; `None` without a UID.
pub(crate) fn row_of(fetch: &Fetch) -> Option<MessageRow> {
    let uid = fetch.uid?;
    let header = fetch.header().unwrap_or_default();
    let mut raw = Vec::with_capacity(header.len() + 4096);
    raw.extend_from_slice(header);
    raw.extend_from_slice(fetch.text().unwrap_or_default());
    let parsed = MessageParser::default().parse(&raw);
    let (subject, from_addr, to_addrs, message_id, preview) = match &parsed {
        Some(m) => (
            m.subject().map(str::to_string),
            first_address(m.from()),
            all_addresses(m.to()),
            m.message_id().map(str::to_string),
            m.body_text(0).map(|t| {
                let words: Vec<&str> = t.split_whitespace().collect();
                words.join(" ").chars().take(PREVIEW_CHARS).collect::<String>()
            }),
        ),
        None => (None, None, None, None, None),
    };
    Some(MessageRow {
        uid,
        internal_date: fetch.internal_date().map(|d| d.timestamp_millis()),
        size: fetch.size.map(i64::from),
        flags: flags_of(fetch),
        message_id,
        subject,
        from_addr,
        to_addrs,
        header: (!header.is_empty()).then(|| String::from_utf8_lossy(header).into_owned()),
        preview,
    })
}

/// A UID set for a command: ascending `uids` as ranges (`1:5,9,12:14`).
pub(crate) fn uid_set(uids: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < uids.len() {
        let start = uids[i];
        let mut end = start;
        while i + 1 < uids.len() && uids[i + 1] == end + 1 {
            i += 1;
            end = uids[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}:{end}"));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_sets_are_ranges() {
        assert_eq!(uid_set(&[1, 2, 3, 5, 7, 8]), "1:3,5,7:8");
        assert_eq!(uid_set(&[4]), "4");
        assert_eq!(uid_set(&[]), "");
    }
}
