//! A whole message as the API shows it, read from its raw bytes with
//! mail-parser: the header fields a client shows, the text and HTML bodies
//! decoded to UTF-8, and the attachments by IMAP part number (`2`, `1.2`,
//! as `BODY[section]` names them), so a part can be fetched alone later.
//!
//! Reading never fails: mail-parser reads broken MIME as best it can, and
//! bytes that are no message at all come back as a text body.
//!
//! A part can also be judged from its MIME header alone ([`streamable`],
//! [`is_multipart`]: what `BODY[<part>.MIME]` and `BODY[HEADER]` give), so
//! that an attachment streams without the rest of the message: mail-parser
//! reads the header as it would in the whole message, and says how the
//! part is typed, named and encoded.

use mail_parser::{Address, Encoding, HeaderValue, Message, MessageParser, MessagePart, MimeHeaders, PartType};

use super::transfer::Transfer;

/// One address of a header field.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Mailbox {
    /// The display name.
    pub name: Option<String>,
    /// The address (`local@domain`).
    pub address: Option<String>,
}

/// The header fields a client shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Headers {
    /// Subject.
    pub subject: Option<String>,
    /// From.
    pub from: Vec<Mailbox>,
    /// To.
    pub to: Vec<Mailbox>,
    /// Cc.
    pub cc: Vec<Mailbox>,
    /// Bcc (as stored in the message, usually only in Sent).
    pub bcc: Vec<Mailbox>,
    /// Reply-To.
    pub reply_to: Vec<Mailbox>,
    /// Date, RFC 3339.
    pub date: Option<String>,
    /// Message-ID, without the angle brackets.
    pub message_id: Option<String>,
    /// In-Reply-To, without angle brackets.
    pub in_reply_to: Vec<String>,
    /// References, without angle brackets, oldest first.
    pub references: Vec<String>,
}

/// An attachment (or inline part) of a message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Attachment {
    /// Its IMAP part number: `GET .../attachments/{part}` downloads it.
    #[schema(example = "2")]
    pub part: String,
    /// Its file name, when it has one.
    pub filename: Option<String>,
    /// Its content type (`image/png`; `message/rfc822` for a forwarded message).
    pub content_type: String,
    /// Its decoded size in bytes.
    pub size: u64,
    /// Whether it is shown inline (`Content-Disposition: inline`).
    pub inline: bool,
    /// Its Content-ID, without angle brackets (what `cid:` links in the HTML name).
    pub content_id: Option<String>,
}

/// What the API shows of a whole message.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct MessageBody {
    /// The header fields.
    pub headers: Headers,
    /// The text bodies, decoded to UTF-8 and joined (an HTML-only message's
    /// text is made from its HTML).
    pub text: Option<String>,
    /// The HTML bodies, decoded to UTF-8 and joined; `null` when the message has none.
    pub html: Option<String>,
    /// The attachments, in the message's order.
    pub attachments: Vec<Attachment>,
}

/// One part's decoded content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartContent {
    /// Its content type; text is sent as UTF-8 (`; charset=utf-8`).
    pub content_type: String,
    /// Its file name, when it has one.
    pub filename: Option<String>,
    /// Whether it is shown inline.
    pub inline: bool,
    /// The decoded bytes.
    pub bytes: Vec<u8>,
}

/// How a part that can stream is shown and decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartHead {
    /// Its type, name and disposition, as [`part`] gives them (no bytes).
    pub content: PartContent,
    /// Its Content-Transfer-Encoding, as mail-parser reads it.
    pub transfer: Transfer,
}

/// `header` (a header block, with or without its blank line) parsed as a
/// message of that header and no body.
fn parse_header(header: &[u8]) -> Option<Message<'static>> {
    let end = header.iter().rposition(|b| *b != b'\r' && *b != b'\n').map_or(0, |i| i + 1);
    let mut block = header[..end].to_vec();
    block.extend_from_slice(b"\r\n\r\n");
    MessageParser::default().parse(&block).map(Message::into_owned)
}

/// Whether the part with this MIME header is a multipart mail-parser
/// divides into parts (it has a boundary).
pub(crate) fn is_multipart(header: &[u8]) -> bool {
    parse_header(header).is_some_and(|m| {
        m.root_part().content_type().is_some_and(|ct| ct.ctype() == "multipart" && ct.attribute("boundary").is_some())
    })
}

/// How the part with this MIME header is shown and decoded, when it can
/// stream: a leaf that mail-parser keeps as bytes. `None` for a multipart,
/// for text (mail-parser re-encodes it to UTF-8 from its charset), for an
/// encapsulated message (which it parses), and for a part without a
/// Content-Type (text/plain by default).
pub(crate) fn streamable(header: &[u8]) -> Option<PartHead> {
    let message = parse_header(header)?;
    let p = message.root_part();
    let ct = p.content_type()?;
    let message_type = ct.ctype() == "message" && matches!(ct.subtype(), Some("rfc822" | "global"));
    if ct.ctype() == "multipart" || message_type || !matches!(p.body, PartType::Binary(_) | PartType::InlineBinary(_)) {
        return None;
    }
    let transfer = match p.encoding {
        Encoding::Base64 => Transfer::Base64,
        Encoding::QuotedPrintable => Transfer::QuotedPrintable,
        Encoding::None => Transfer::Identity,
    };
    Some(PartHead { content: content(p), transfer })
}

fn parse(raw: &[u8]) -> Option<Message<'_>> {
    MessageParser::default().parse(raw)
}

/// Reads `raw` (RFC 5322 bytes).
pub fn read(raw: &[u8]) -> MessageBody {
    let Some(message) = parse(raw) else {
        // Not even a header: what there is, as text.
        return MessageBody { text: Some(String::from_utf8_lossy(raw).into_owned()), ..MessageBody::default() };
    };
    let joined = |parts: Vec<String>| if parts.is_empty() { None } else { Some(parts.join("\n")) };
    let mut text =
        joined((0..message.text_body_count()).filter_map(|i| message.body_text(i)).map(|c| c.into_owned()).collect());
    let mut html = joined(
        message
            .html_body
            .iter()
            .filter_map(|id| message.part(*id))
            .filter_map(|p| match &p.body {
                PartType::Html(h) => Some(h.to_string()),
                _ => None,
            })
            .collect(),
    );
    if text.is_none() && html.is_none() {
        // Broken MIME (a bad transfer encoding, a boundary that never
        // closes) can leave every part an "attachment": show the text parts
        // that are not attached files as the bodies.
        let unnamed = |p: &&MessagePart<'_>| !p.content_disposition().is_some_and(|d| d.is_attachment());
        let parts: Vec<&MessagePart<'_>> =
            message.attachments.iter().filter_map(|id| message.part(*id)).filter(unnamed).collect();
        let of = |html: bool| {
            parts
                .iter()
                .filter(|p| p.is_content_type("text", "html") == html)
                .filter_map(|p| match &p.body {
                    PartType::Text(t) | PartType::Html(t) => Some(t.to_string()),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        text = joined(of(false));
        html = joined(of(true));
        if text.is_none() && html.is_none() && parts.is_empty() {
            // No part at all: whatever follows the header, as it is.
            let start = message.root_part().raw_body_offset() as usize;
            text = Some(String::from_utf8_lossy(raw.get(start..).unwrap_or_default()).into_owned());
        }
    }
    let sections = sections(&message);
    let attachments = message
        .attachments
        .iter()
        .filter_map(|id| Some((sections.get(*id as usize)?.clone()?, message.part(*id)?)))
        .map(|(part, p)| {
            let c = content(p);
            Attachment {
                part,
                filename: c.filename,
                content_type: c.content_type,
                size: p.len() as u64,
                inline: c.inline,
                content_id: p.content_id().map(|id| id.trim_matches(['<', '>']).to_string()),
            }
        })
        .collect();
    MessageBody { headers: headers(&message), text, html, attachments }
}

/// The decoded content of part `section` (an IMAP part number) of `raw`;
/// `None` when the message has no such part, or it is a multipart.
pub fn part(raw: &[u8], section: &str) -> Option<PartContent> {
    let message = parse(raw)?;
    let sections = sections(&message);
    let id = sections.iter().position(|s| s.as_deref() == Some(section))?;
    let p = message.part(u32::try_from(id).ok()?)?;
    if p.is_multipart() {
        return None;
    }
    let mut c = content(p);
    c.bytes = p.contents().to_vec();
    Some(c)
}

/// A part's type, name and disposition (its bytes left empty).
fn content(p: &MessagePart<'_>) -> PartContent {
    let mut content_type = match p.content_type() {
        Some(ct) => match ct.subtype() {
            Some(sub) => format!("{}/{}", ct.ctype(), sub),
            None => ct.ctype().to_string(),
        },
        None if p.is_message() => "message/rfc822".to_string(),
        None => "text/plain".to_string(),
    }
    .to_ascii_lowercase();
    // mail-parser decodes text parts to UTF-8, whatever charset they were in.
    if matches!(p.body, PartType::Text(_) | PartType::Html(_)) {
        content_type.push_str("; charset=utf-8");
    }
    let filename = p.attachment_name().map(str::to_string).or_else(|| {
        // A forwarded message is named by its subject.
        p.message().and_then(|m| m.subject()).map(|s| format!("{s}.eml"))
    });
    let inline = p.content_disposition().is_some_and(|d| d.is_inline());
    PartContent { content_type, filename, inline, bytes: Vec::new() }
}

/// The IMAP part number of each part of `message` (by mail-parser's part
/// id), `None` for the root multipart, which has none. RFC 3501 §6.4.5: the
/// parts of a multipart are numbered from 1 under their parent's number; a
/// message that is not multipart has one part, `1`; the parts of an
/// encapsulated `message/rfc822` are numbered under it as a message's are.
fn sections(message: &Message<'_>) -> Vec<Option<String>> {
    let mut out = vec![None; message.parts.len()];
    match message.parts.first().and_then(|root| root.sub_parts()) {
        Some(children) => number_children(message, children, "", &mut out),
        None if !message.parts.is_empty() => out[0] = Some("1".to_string()),
        None => {}
    }
    out
}

fn number_children(message: &Message<'_>, children: &[u32], prefix: &str, out: &mut [Option<String>]) {
    for (i, id) in children.iter().enumerate() {
        let number = format!("{prefix}{}", i + 1);
        if let Some(slot) = out.get_mut(*id as usize) {
            *slot = Some(number.clone());
        }
        if let Some(grandchildren) = message.part(*id).and_then(|p| p.sub_parts()) {
            number_children(message, grandchildren, &format!("{number}."), out);
        }
    }
}

fn mailboxes(a: Option<&Address<'_>>) -> Vec<Mailbox> {
    a.map(|a| {
        a.iter()
            .map(|m| Mailbox { name: m.name().map(str::to_string), address: m.address().map(str::to_string) })
            .collect()
    })
    .unwrap_or_default()
}

fn ids(v: &HeaderValue<'_>) -> Vec<String> {
    match v {
        HeaderValue::Text(t) => vec![t.to_string()],
        HeaderValue::TextList(l) => l.iter().map(|t| t.to_string()).collect(),
        _ => Vec::new(),
    }
}

fn headers(m: &Message<'_>) -> Headers {
    Headers {
        subject: m.subject().map(str::to_string),
        from: mailboxes(m.from()),
        to: mailboxes(m.to()),
        cc: mailboxes(m.cc()),
        bcc: mailboxes(m.bcc()),
        reply_to: mailboxes(m.reply_to()),
        date: m.date().map(|d| d.to_rfc3339()),
        message_id: m.message_id().map(str::to_string),
        in_reply_to: ids(m.in_reply_to()),
        references: ids(m.references()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALTERNATIVE_WITH_ATTACHMENTS: &str = "From: \"Jörg\" <j@example.org>\r\n\
To: a@example.org, \"B\" <b@example.org>\r\n\
Cc: c@example.org\r\n\
Reply-To: r@example.org\r\n\
Subject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe?=\r\n\
Date: Tue, 1 Dec 2026 10:00:00 +0100\r\n\
Message-ID: <m1@example.org>\r\n\
In-Reply-To: <m0@example.org>\r\n\
References: <a@example.org> <m0@example.org>\r\n\
MIME-Version: 1.0\r\n\
Content-Type: multipart/mixed; boundary=outer\r\n\
\r\n\
--outer\r\n\
Content-Type: multipart/alternative; boundary=inner\r\n\
\r\n\
--inner\r\n\
Content-Type: text/plain; charset=iso-8859-1\r\n\
Content-Transfer-Encoding: quoted-printable\r\n\
\r\n\
Gr=FC=DFe aus K=F6ln\r\n\
--inner\r\n\
Content-Type: text/html; charset=utf-8\r\n\
\r\n\
<p>Grüße <img src=\"cid:logo@x\"></p>\r\n\
--inner--\r\n\
--outer\r\n\
Content-Type: image/png\r\n\
Content-Disposition: inline\r\n\
Content-ID: <logo@x>\r\n\
Content-Transfer-Encoding: base64\r\n\
\r\n\
iVBORw0KGgo=\r\n\
--outer\r\n\
Content-Type: text/plain; charset=koi8-r; name=\"notes.txt\"\r\n\
Content-Disposition: attachment; filename=\"notes.txt\"\r\n\
Content-Transfer-Encoding: base64\r\n\
\r\n\
8NLJ18XU\r\n\
--outer\r\n\
Content-Type: message/rfc822\r\n\
\r\n\
From: x@example.org\r\n\
Subject: inner\r\n\
Content-Type: multipart/mixed; boundary=nested\r\n\
\r\n\
--nested\r\n\
Content-Type: text/plain\r\n\
\r\n\
forwarded text\r\n\
--nested\r\n\
Content-Type: application/pdf; name=a.pdf\r\n\
\r\n\
%PDF\r\n\
--nested--\r\n\
--outer--\r\n";

    #[test]
    fn a_multipart_message_is_read_whole() {
        let raw = ALTERNATIVE_WITH_ATTACHMENTS.as_bytes();
        let body = read(raw);
        let h = &body.headers;
        assert_eq!(h.subject.as_deref(), Some("Grüße"));
        assert_eq!(h.from, [Mailbox { name: Some("Jörg".into()), address: Some("j@example.org".into()) }]);
        assert_eq!(h.to.len(), 2);
        assert_eq!(h.cc[0].address.as_deref(), Some("c@example.org"));
        assert_eq!(h.reply_to[0].address.as_deref(), Some("r@example.org"));
        assert_eq!(h.date.as_deref(), Some("2026-12-01T10:00:00+01:00"));
        assert_eq!(h.message_id.as_deref(), Some("m1@example.org"));
        assert_eq!(h.in_reply_to, ["m0@example.org"]);
        assert_eq!(h.references, ["a@example.org", "m0@example.org"]);
        assert_eq!(body.text.as_deref(), Some("Grüße aus Köln"));
        assert!(body.html.as_deref().unwrap().contains("<p>Grüße"));
        let summary: Vec<_> = body
            .attachments
            .iter()
            .map(|a| (a.part.as_str(), a.content_type.as_str(), a.filename.as_deref(), a.inline))
            .collect();
        assert_eq!(
            summary,
            [
                ("2", "image/png", None, true),
                ("3", "text/plain; charset=utf-8", Some("notes.txt"), false),
                ("4", "message/rfc822", Some("inner.eml"), false),
            ]
        );
        assert_eq!(body.attachments[0].content_id.as_deref(), Some("logo@x"));
        assert_eq!(body.attachments[0].size, 8);

        // Parts come back decoded, by the numbers IMAP gives them.
        assert_eq!(part(raw, "2").unwrap().bytes, b"\x89PNG\r\n\x1a\n");
        assert_eq!(String::from_utf8(part(raw, "3").unwrap().bytes).unwrap(), "Привет");
        assert_eq!(part(raw, "1.1").unwrap().content_type, "text/plain; charset=utf-8");
        let forwarded = part(raw, "4").unwrap();
        assert!(String::from_utf8_lossy(&forwarded.bytes).contains("Subject: inner"));
        assert!(part(raw, "1").is_none(), "a multipart has no content of its own");
        assert!(part(raw, "9").is_none());
    }

    #[test]
    fn a_single_part_message_is_part_one() {
        let raw = b"Subject: hi\r\nContent-Type: application/octet-stream; name=x.bin\r\n\
Content-Disposition: attachment\r\nContent-Transfer-Encoding: base64\r\n\r\nAAEC\r\n";
        let body = read(raw);
        assert_eq!(body.attachments.len(), 1);
        assert_eq!(body.attachments[0].part, "1");
        assert_eq!(part(raw, "1").unwrap().bytes, [0, 1, 2]);
    }

    #[test]
    fn broken_mime_and_non_mail_come_back_readable() {
        // A boundary that never closes, a bad base64 body, an 8-bit header.
        let raw = b"Subject: caf\xc3\xa9 \xff\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\n\
Content-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n!!!not base64\r\n--b\r\n\
Content-Type: text/html\r\n\r\n<b>unterminated";
        let body = read(raw);
        assert!(body.headers.subject.as_deref().unwrap().starts_with("café"));
        assert_eq!(body.text.as_deref(), Some("!!!not base64"), "{body:?}");
        assert!(body.html.as_deref().unwrap().contains("unterminated"), "{body:?}");
        let body = read(b"");
        assert_eq!(body.text.as_deref(), Some(""));
        let body = read(&[0xff, 0xfe, 0, 1]);
        assert!(body.text.is_some());
    }

    #[test]
    fn a_part_is_judged_by_its_header_as_in_the_whole_message() {
        let raw = ALTERNATIVE_WITH_ATTACHMENTS.as_bytes();
        let header_of = |marker: &str| {
            let text = ALTERNATIVE_WITH_ATTACHMENTS;
            let start = text.find(marker).unwrap();
            let end = start + text[start..].find("\r\n\r\n").unwrap();
            text.as_bytes()[start..end].to_vec()
        };
        let png = streamable(&header_of("Content-Type: image/png")).unwrap();
        assert_eq!(png.transfer, Transfer::Base64);
        assert_eq!(png.content, PartContent { bytes: Vec::new(), ..part(raw, "2").unwrap() });
        // Text is re-encoded to UTF-8, a message parsed: neither streams.
        assert!(streamable(&header_of("Content-Type: text/plain; charset=koi8-r")).is_none());
        assert!(streamable(&header_of("Content-Type: message/rfc822")).is_none());
        assert!(streamable(b"Content-Disposition: attachment\r\n").is_none(), "no type: text/plain");
        assert!(streamable(&header_of("Content-Type: multipart/alternative")).is_none());
        assert!(is_multipart(&header_of("Content-Type: multipart/alternative")));
        assert!(is_multipart(raw));
        assert!(!is_multipart(b"Content-Type: multipart/mixed\r\n"), "no boundary: not divided");
        let pdf = streamable(
            b"Content-Type: application/pdf; name=\"=?UTF-8?B?w7xiZXIucGRm?=\"\r\nContent-Transfer-Encoding: \
              Quoted-Printable\r\n",
        )
        .unwrap();
        assert_eq!((pdf.content.filename.as_deref(), pdf.transfer), (Some("über.pdf"), Transfer::QuotedPrintable));
        let odd = streamable(b"Content-Type: application/x-thing\r\nContent-Transfer-Encoding: x-uuencode\r\n");
        assert_eq!(odd.unwrap().transfer, Transfer::Identity, "mail-parser passes an unknown encoding through");
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_read_without_a_panic(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            let body = read(&raw);
            for a in &body.attachments {
                let _ = part(&raw, &a.part);
            }
        }
    }
}
