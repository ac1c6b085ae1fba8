//! Realistic RFC 5322 messages, deterministic from a seed.
//!
//! Each message is 2–50 KB: a plain text mail, a multipart/alternative (text
//! and HTML), or a multipart/mixed with that alternative and one or two
//! attachments (PDF, CSV or JPEG bytes, base64). Headers are the ones real
//! mail carries (Received, Message-ID, Date, From, To, Cc, Reply-To,
//! In-Reply-To, References, List-Id, X-Mailer), with names and subjects in
//! several scripts (RFC 2047-encoded). The same `(seed, index)` always gives
//! the same bytes, so a benchmark's mailbox can be rebuilt exactly.

use std::borrow::Cow;

use mail_builder::headers::raw::Raw;
use mail_builder::mime::MimePart;
use mail_builder::MessageBuilder;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

/// The smallest message this makes, in bytes.
pub const MIN_SIZE: usize = 2 * 1024;
/// The largest message this makes, in bytes.
pub const MAX_SIZE: usize = 50 * 1024;

/// The MIME structure of a generated message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// One text/plain part.
    Plain,
    /// multipart/alternative of text/plain and text/html.
    Alternative,
    /// multipart/mixed of an alternative and attachments.
    WithAttachments,
}

/// One generated message and what went into it (for checking a sync's result).
#[derive(Debug, Clone)]
pub struct GeneratedMessage {
    /// The raw message, CRLF line ends, ready for APPEND.
    pub raw: Vec<u8>,
    /// The Message-ID without angle brackets.
    pub message_id: String,
    /// The subject, decoded.
    pub subject: String,
    /// The sender's address.
    pub from: String,
    /// The Date header, in seconds since the Unix epoch.
    pub date: i64,
    /// The MIME structure.
    pub shape: Shape,
    /// The attachments' file names.
    pub attachments: Vec<String>,
}

/// The `index`-th message of the stream of `seed`.
pub fn message(seed: u64, index: u64) -> GeneratedMessage {
    // The size target shrinks or grows until the encoded message fits the
    // bounds; each try starts from the same random state, so the result
    // depends on (seed, index) alone.
    let mut scale = 1.0;
    let mut built = build(seed, index, scale);
    for _ in 0..8 {
        let len = built.raw.len();
        if (MIN_SIZE..=MAX_SIZE).contains(&len) {
            break;
        }
        let goal = if len > MAX_SIZE { MAX_SIZE as f64 * 0.9 } else { MIN_SIZE as f64 * 1.2 };
        scale *= goal / len as f64;
        built = build(seed, index, scale);
    }
    built
}

/// An endless, deterministic stream of messages: `message(seed, 0)`, `message(seed, 1)`, …
#[derive(Debug, Clone)]
pub struct MailGen {
    seed: u64,
    next: u64,
}

impl MailGen {
    /// The stream of `seed`, from its first message.
    pub fn new(seed: u64) -> Self {
        Self { seed, next: 0 }
    }
}

impl Iterator for MailGen {
    type Item = GeneratedMessage;

    fn next(&mut self) -> Option<GeneratedMessage> {
        let message = message(self.seed, self.next);
        self.next += 1;
        Some(message)
    }
}

const PEOPLE: &[(&str, &str)] = &[
    ("Alice Martin", "alice.martin@example.com"),
    ("José Álvarez", "jose.alvarez@example.es"),
    ("Zoë Müller", "zoe.mueller@example.de"),
    ("Ольга Петрова", "olga.petrova@example.ru"),
    ("李雷", "li.lei@example.cn"),
    ("Aoife Ní Bhriain", "aoife@example.ie"),
    ("Søren Kierkegaard", "soren@example.dk"),
    ("Priya Raman", "priya.raman@example.in"),
    ("Sam Taylor", "sam@example.org"),
    ("Ngozi Okafor", "ngozi.okafor@example.ng"),
    ("田中 花子", "hanako.tanaka@example.jp"),
    ("Billing", "billing@shop.example.net"),
    ("GitHub", "notifications@github.example.com"),
    ("Mateus Gonçalves", "mateus@example.com.br"),
];

const SUBJECTS: &[&str] = &[
    "Quarterly report draft",
    "Réunion de l'équipe — ordre du jour",
    "Статус проекта на этой неделе",
    "会议纪要：产品路线图",
    "Your invoice #{n} is ready",
    "Lunch on Thursday? 🍜",
    "Überprüfung der Zugangsdaten",
    "[leasehold] Build #{n} failed on main",
    "Photos from the trip ✈️",
    "Contrato de arrendamiento — versión final",
    "Re-scheduling our 1:1",
    "見積書の送付について",
    "Security alert: new sign-in",
    "Weekly digest: 12 new posts",
];

const MAILERS: &[&str] = &[
    "Mozilla Thunderbird 115.6",
    "Apple Mail (2.3774)",
    "Microsoft Outlook 16.0",
    "Roundcube Webmail/1.6.5",
    "K-9 Mail for Android",
];

const WORDS: &[&str] = &[
    "the",
    "project",
    "deadline",
    "review",
    "meeting",
    "budget",
    "we",
    "should",
    "update",
    "before",
    "Friday",
    "please",
    "find",
    "attached",
    "numbers",
    "for",
    "last",
    "quarter",
    "and",
    "let",
    "me",
    "know",
    "if",
    "anything",
    "looks",
    "off",
    "thanks",
    "café",
    "naïve",
    "résumé",
    "Grüße",
    "спасибо",
    "谢谢",
    "also",
    "schedule",
    "customer",
    "release",
    "server",
    "mailbox",
    "sync",
    "tomorrow",
    "morning",
    "draft",
    "notes",
    "agenda",
    "follow-up",
    "question",
    "answer",
    "today",
    "invoice",
    "payment",
    "shipping",
    "order",
    "ticket",
];

struct Draft {
    rng: ChaCha8Rng,
    index: u64,
    boundary_n: u32,
}

fn build(seed: u64, index: u64, scale: f64) -> GeneratedMessage {
    let rng = ChaCha8Rng::seed_from_u64(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut d = Draft { rng, index, boundary_n: 0 };
    let target = (d.rng.random_range(2_600.0f64.ln()..45_000.0f64.ln()).exp() * scale) as usize;
    let shape = match d.rng.random_range(0..10) {
        0..=2 => Shape::Plain,
        3..=6 => Shape::Alternative,
        _ => Shape::WithAttachments,
    };
    let (from_name, from) = PEOPLE[d.rng.random_range(0..PEOPLE.len())];
    let (to_name, to) = PEOPLE[d.rng.random_range(0..PEOPLE.len())];
    let cc: Vec<(&str, &str)> =
        (0..d.rng.random_range(0..3)).map(|_| PEOPLE[d.rng.random_range(0..PEOPLE.len())]).collect();
    let reply = d.rng.random_bool(0.3);
    let topic = SUBJECTS[d.rng.random_range(0..SUBJECTS.len())].replace("{n}", &(1000 + index).to_string());
    let subject = if reply { format!("Re: {topic}") } else { topic };
    // Dates walk forward from 2024-01-01, a few minutes apart.
    let date = 1_704_067_200 + index as i64 * 300 + d.rng.random_range(0..300i64);
    let message_id = format!("{:016x}.{index}.{:08x}@mail.example.test", seed, d.rng.random::<u32>());
    let host = ["mx1.example.net", "mx2.example.net", "smtp.example.org"][d.rng.random_range(0..3)];
    let received = |hop: u32, rng: &mut ChaCha8Rng| {
        format!(
            "from {host} ([192.0.2.{}]) by mail.example.test with ESMTPS id {:012x}; {}",
            rng.random_range(1..255),
            rng.random::<u64>() & 0xffff_ffff_ffff,
            mail_builder::headers::date::Date::new(date + i64::from(hop)).to_rfc822()
        )
    };
    let mut builder = MessageBuilder::new()
        .header("Received", Raw::new(received(2, &mut d.rng)))
        .header("Received", Raw::new(received(1, &mut d.rng)))
        .message_id(message_id.clone())
        .date(date)
        .from((from_name, from))
        .to(vec![(to_name, to)])
        .subject(subject.clone())
        .header("X-Mailer", Raw::new(MAILERS[d.rng.random_range(0..MAILERS.len())]));
    if !cc.is_empty() {
        builder = builder.cc(cc);
    }
    if d.rng.random_bool(0.2) {
        builder = builder.reply_to((from_name, from));
    }
    if reply {
        let parent = format!("{:016x}.{}.parent@mail.example.test", seed, index.saturating_sub(1));
        builder = builder.in_reply_to(parent.clone()).references(parent);
    }
    if d.rng.random_bool(0.15) {
        builder = builder.header("List-Id", Raw::new("Team updates <team.lists.example.test>"));
    }

    let header_estimate = 900;
    let body = target.saturating_sub(header_estimate).max(400);
    let mut attachments = Vec::new();
    let part = match shape {
        Shape::Plain => MimePart::new("text/plain", d.text(body)),
        Shape::Alternative => d.alternative(body),
        Shape::WithAttachments => {
            let count = d.rng.random_range(1..=2usize);
            // Base64 costs a third more: the attachments take ~60% of the bytes.
            let each = body * 6 / 10 * 3 / 4 / count;
            let mut parts = vec![d.alternative(body * 4 / 10)];
            for _ in 0..count {
                let (name, part) = d.attachment(each.max(200));
                attachments.push(name);
                parts.push(part);
            }
            d.multipart("multipart/mixed", parts)
        }
    };
    let raw = builder.body(part).write_to_vec().unwrap_or_default();
    GeneratedMessage { raw, message_id, subject, from: from.to_owned(), date, shape, attachments }
}

impl Draft {
    /// Paragraphs of plain text, about `len` bytes, lines of at most 76.
    fn text(&mut self, len: usize) -> String {
        let mut out = String::with_capacity(len + 80);
        let mut line = 0;
        while out.len() < len {
            let word = WORDS[self.rng.random_range(0..WORDS.len())];
            if line + word.len() > 72 {
                out.push('\n');
                line = 0;
                if self.rng.random_bool(0.15) {
                    out.push('\n');
                }
            } else if line > 0 {
                out.push(' ');
                line += 1;
            }
            out.push_str(word);
            line += word.len();
        }
        out.push('\n');
        out
    }

    fn html(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() * 5 / 4 + 200);
        out.push_str(
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"></head>\n<body style=\"font-family: sans-serif\">\n",
        );
        for paragraph in text.split("\n\n") {
            out.push_str("<p>");
            out.push_str(&paragraph.replace('\n', " "));
            out.push_str("</p>\n");
        }
        out.push_str("</body></html>\n");
        out
    }

    fn alternative(&mut self, len: usize) -> MimePart<'static> {
        let text = self.text(len * 45 / 100);
        let html = self.html(&text);
        self.multipart(
            "multipart/alternative",
            vec![MimePart::new("text/plain", text), MimePart::new("text/html", html)],
        )
    }

    /// A multipart with a boundary from the seed (mail-builder's own is random).
    fn multipart(&mut self, content_type: &'static str, parts: Vec<MimePart<'static>>) -> MimePart<'static> {
        self.boundary_n += 1;
        let boundary = format!("=_lh{}_{}_{:016x}", self.index, self.boundary_n, self.rng.random::<u64>());
        let content_type = mail_builder::headers::content_type::ContentType::new(content_type)
            .attribute("boundary", Cow::Owned(boundary));
        MimePart::new(content_type, parts)
    }

    fn attachment(&mut self, len: usize) -> (String, MimePart<'static>) {
        match self.rng.random_range(0..3) {
            0 => {
                let mut bytes = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n".to_vec();
                bytes.extend((bytes.len()..len).map(|_| self.rng.random::<u8>()));
                let name = format!("report-{}.pdf", self.index);
                (name.clone(), MimePart::new("application/pdf", bytes).attachment(name))
            }
            1 => {
                let mut csv = String::from("date,item,amount\n");
                while csv.len() < len {
                    let row = format!(
                        "2024-{:02}-{:02},{},{}.{:02}\n",
                        self.rng.random_range(1..13),
                        self.rng.random_range(1..29),
                        WORDS[self.rng.random_range(0..WORDS.len())],
                        self.rng.random_range(1..5000),
                        self.rng.random_range(0..100)
                    );
                    csv.push_str(&row);
                }
                let name = format!("données-{}.csv", self.index);
                (name.clone(), MimePart::new("text/csv", csv).attachment(name))
            }
            _ => {
                let mut bytes = vec![0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, b'J', b'F', b'I', b'F', 0x00];
                bytes.extend((bytes.len()..len).map(|_| self.rng.random::<u8>()));
                let name = format!("IMG_{:04}.jpg", self.index % 10_000);
                (name.clone(), MimePart::new("image/jpeg", bytes).attachment(name))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_deterministic_from_seed_and_index() {
        assert_eq!(message(7, 3).raw, message(7, 3).raw);
        assert_ne!(message(7, 3).raw, message(7, 4).raw);
        assert_ne!(message(7, 3).raw, message(8, 3).raw);
        let streamed: Vec<Vec<u8>> = MailGen::new(7).take(5).map(|m| m.raw).collect();
        assert_eq!(streamed[3], message(7, 3).raw);
    }

    #[test]
    fn sizes_stay_within_bounds_and_every_shape_occurs() {
        let mut shapes = std::collections::HashSet::new();
        let (mut smallest, mut largest) = (usize::MAX, 0);
        for m in MailGen::new(42).take(400) {
            let len = m.raw.len();
            assert!((MIN_SIZE..=MAX_SIZE).contains(&len), "message {} is {len} bytes", m.message_id);
            smallest = smallest.min(len);
            largest = largest.max(len);
            shapes.insert(m.shape);
            assert_eq!(m.shape == Shape::WithAttachments, !m.attachments.is_empty());
        }
        assert_eq!(shapes.len(), 3);
        assert!(smallest < 5 * 1024 && largest > 30 * 1024, "sizes span {smallest}..{largest}");
    }

    #[test]
    fn a_real_parser_reads_back_what_went_in() {
        for m in MailGen::new(5).take(120) {
            use mail_parser::MimeHeaders;
            let parsed = mail_parser::MessageParser::default().parse(&m.raw).expect("a parsable message");
            assert_eq!(parsed.subject(), Some(m.subject.as_str()), "{}", m.message_id);
            assert_eq!(parsed.message_id(), Some(m.message_id.as_str()));
            assert_eq!(parsed.date().map(|d| d.to_timestamp()), Some(m.date));
            let from = parsed.from().and_then(|a| a.first()).and_then(|a| a.address());
            assert_eq!(from, Some(m.from.as_str()));
            let names: Vec<String> =
                parsed.attachments().filter_map(|a| a.attachment_name().map(str::to_owned)).collect();
            assert_eq!(names, m.attachments, "{}", m.message_id);
            let text = parsed.body_text(0).expect("a text body");
            assert!(text.split_whitespace().count() > 20, "a text body of words: {text:.80}");
            let has_html = parsed
                .parts
                .iter()
                .any(|p| p.content_type().is_some_and(|c| c.ctype() == "text" && c.subtype() == Some("html")));
            assert_eq!(has_html, m.shape != Shape::Plain, "{:?} {}", m.shape, m.message_id);
        }
    }

    #[test]
    fn headers_are_real_and_non_ascii_is_encoded() {
        let mut saw_encoded = false;
        for m in MailGen::new(1).take(50) {
            let raw = String::from_utf8(m.raw.clone()).expect("a generated message is 7-bit or UTF-8 safe");
            let head = &raw[..raw.find("\r\n\r\n").expect("a header/body separator")];
            assert!(head.is_ascii(), "headers must be 7-bit: {head}");
            for name in ["Received: ", "Message-ID: <", "Date: ", "From: ", "To: ", "Subject: ", "MIME-Version: 1.0"] {
                assert!(head.contains(name), "missing {name} in {head}");
            }
            saw_encoded |= head.contains("=?utf-8?");
        }
        assert!(saw_encoded, "some subjects or names are non-ASCII, so RFC 2047-encoded");
    }
}
