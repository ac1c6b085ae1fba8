//! One FETCH answer into one stored row: flags, dates and size from IMAP,
//! subject, addresses and a short preview parsed by mail-parser from the
//! header and the start of the text.

use async_imap::types::{Fetch, Flag};
use std::sync::LazyLock;

use mail_parser::{Address, HeaderName, MessageParser};

use crate::storage::MessageRow;

/// What new mail is fetched with: the attributes, the header, and the first
/// bytes of the text (enough for a preview, bounded whatever the size).
pub const NEW_MAIL_QUERY: &str = "(UID FLAGS INTERNALDATE RFC822.SIZE BODY.PEEK[HEADER] BODY.PEEK[TEXT]<0.4096>)";

/// The parser of new mail: only the headers a row keeps and those that
/// decode the text; the rest (`Received:` above all, a tokenizer of its
/// own) are skipped, not parsed.
static PARSER: LazyLock<MessageParser> = LazyLock::new(|| {
    MessageParser::new()
        .with_mime_headers()
        .header_text(HeaderName::Subject)
        .header_address(HeaderName::From)
        .header_address(HeaderName::To)
        .header_id(HeaderName::MessageId)
        .default_header_ignore()
});

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
    let raw = header_and_text(header, fetch.text().unwrap_or_default());
    let parsed = PARSER.parse(&raw);
    let (subject, from_addr, to_addrs, message_id, preview) = match &parsed {
        Some(m) => (
            m.subject().map(str::to_string),
            first_address(m.from()),
            all_addresses(m.to()),
            m.message_id().map(str::to_string),
            m.body_text(0).map(|t| preview_of(&t)),
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

/// The header and the start of the text as one message for the parser. A
/// message of headers alone may lack the blank line that ends them
/// (RFC 5322 allows it); without one the parser drops the last header.
fn header_and_text(header: &[u8], text: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(header.len() + 4 + text.len());
    raw.extend_from_slice(header);
    if !header.is_empty() && !header.ends_with(b"\r\n\r\n") && !header.ends_with(b"\n\n") {
        if !header.ends_with(b"\n") {
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(text);
    raw
}

/// The first [`PREVIEW_CHARS`] characters of `text`, each run of white
/// space one space; only as much of the text is read as the preview needs.
fn preview_of(text: &str) -> String {
    let mut out = String::with_capacity(PREVIEW_CHARS + 8);
    let mut chars = 0;
    for word in text.split_whitespace() {
        if chars >= PREVIEW_CHARS {
            break;
        }
        if chars > 0 {
            out.push(' ');
            chars += 1;
        }
        for c in word.chars().take(PREVIEW_CHARS.saturating_sub(chars)) {
            out.push(c);
            chars += 1;
        }
    }
    out
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

    /// The fields a row keeps are what the full parser gives.
    #[test]
    fn the_lean_parser_keeps_every_field_a_row_needs() {
        let raw = concat!(
            "Received: from mx.example.org (mx [192.0.2.1]) by in.example.org; Mon, 2 Dec 2024 10:00:00 +0000\r\n",
            "From: =?UTF-8?Q?J=C3=BCrgen_M=C3=BCller?= <jm@example.org>\r\n",
            "To: ann@example.org, \"Bob\" <bob@example.org>\r\n",
            "Subject: =?UTF-8?B?w5xiZXIgZGllIEFuZ2Vib3Rl?= (2024)\r\n",
            "Message-ID: <abc.123@example.org>\r\n",
            "Date: Mon, 2 Dec 2024 10:00:00 +0000\r\n",
            "MIME-Version: 1.0\r\n",
            "Content-Type: multipart/alternative; boundary=\"b1\"\r\n",
            "\r\n",
            "--b1\r\n",
            "Content-Type: text/plain; charset=iso-8859-1\r\n",
            "Content-Transfer-Encoding: quoted-printable\r\n",
            "\r\n",
            "Gr=FC=DFe aus M=FCnchen,\r\nbis   bald=\r\n!\r\n",
            "--b1\r\n",
            "Content-Type: text/html\r\n",
            "\r\n",
            "<p>html</p>\r\n",
            "--b1--\r\n",
        )
        .as_bytes();
        let fields = |m: &mail_parser::Message<'_>| {
            (
                m.subject().map(str::to_owned),
                first_address(m.from()),
                all_addresses(m.to()),
                m.message_id().map(str::to_owned),
                m.body_text(0).map(|t| preview_of(&t)),
            )
        };
        let lean = fields(&PARSER.parse(raw).expect("lean"));
        assert_eq!(lean, fields(&MessageParser::default().parse(raw).expect("full")));
        assert_eq!(lean.0.as_deref(), Some("Über die Angebote (2024)"));
        assert_eq!(lean.1.as_deref(), Some("Jürgen Müller <jm@example.org>"));
        assert_eq!(lean.2.as_deref(), Some("ann@example.org, bob@example.org"));
        assert_eq!(lean.4.as_deref(), Some("Grüße aus München, bis bald!"));
    }

    #[test]
    fn a_message_of_headers_alone_keeps_its_last_header() {
        for header in
            [&b"From: x@example.org\r\nSubject: s\r\n"[..], b"From: x@example.org\r\nSubject: s", b"Subject: s\n"]
        {
            let raw = header_and_text(header, b"");
            let parsed = PARSER.parse(&raw).expect("parsed");
            assert_eq!(parsed.subject(), Some("s"), "{:?}", String::from_utf8_lossy(header));
        }
        let whole = header_and_text(b"Subject: s\r\n\r\n", b"body");
        assert_eq!(whole, b"Subject: s\r\n\r\nbody");
    }

    #[test]
    fn a_preview_is_the_text_s_first_words_on_one_line() {
        assert_eq!(preview_of("  Hello,\r\n\r\n  world\t!  "), "Hello, world !");
        let long = "wörd ".repeat(100);
        let p = preview_of(&long);
        assert_eq!(p.chars().count(), PREVIEW_CHARS);
        assert_eq!(
            p,
            long.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(PREVIEW_CHARS).collect::<String>()
        );
        assert_eq!(preview_of(""), "");
    }

    #[test]
    fn uid_sets_are_ranges() {
        assert_eq!(uid_set(&[1, 2, 3, 5, 7, 8]), "1:3,5,7:8");
        assert_eq!(uid_set(&[4]), "4");
        assert_eq!(uid_set(&[]), "");
    }
}
