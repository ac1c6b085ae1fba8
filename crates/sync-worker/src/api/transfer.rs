//! Content-Transfer-Encodings undone as a part streams in: base64 and
//! quoted-printable are decoded chunk by chunk, anything else (7bit, 8bit,
//! binary, an unknown name) passes through as it is.
//!
//! The bytes come out exactly as mail-parser's decoders give them for the
//! same part read whole, quirks included, so that a streamed attachment is
//! the one the message view describes:
//! * base64 skips spaces, tabs and line breaks anywhere; an `=` ends a
//!   group early (and decoding goes on after it); a partial group at the
//!   end is dropped; any other byte is an encoding problem;
//! * quoted-printable drops the whitespace that ends a line, keeps an `=`
//!   followed by what is no hex digit, and writes line breaks as `\r\n`
//!   once the part has shown a `\r` (`\n` until then); a second `=` where a
//!   hex digit belongs is an encoding problem. A part of a multipart ends
//!   as mail-parser ends it at the boundary: as if `\r\n-` followed, of
//!   which the line break and dash (and what an `=` at the very end would
//!   have joined) are dropped.
//!
//! mail-parser reads a part with an encoding problem as text, raw; a stream
//! cannot go back on what it sent, so here the problem is an error that
//! ends the body. Whitespace that may still be dropped is held back, up to
//! [`MAX_HELD`] bytes (past that it is sent, so a part of nothing but
//! spaces costs no memory either).

use base64::Engine as _;

/// The most trailing whitespace of a quoted-printable line held back.
pub const MAX_HELD: usize = 64 << 10;

/// How a part is transfer-encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// `base64`.
    Base64,
    /// `quoted-printable`.
    QuotedPrintable,
    /// Anything else, passed through.
    Identity,
}

/// A part whose transfer encoding mail-parser would have given up on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A byte that base64 has no place for.
    #[error("byte {offset} of the base64 part is {byte:#04x}, which is not base64")]
    Base64 {
        /// Its offset in the encoded part.
        offset: u64,
        /// The byte.
        byte: u8,
    },
    /// `==`, or an `=` where a hex digit belongs.
    #[error("byte {offset} of the quoted-printable part is an `=` where a hex digit belongs")]
    QuotedPrintable {
        /// Its offset in the encoded part.
        offset: u64,
    },
}

const INVALID: u8 = 0xff;

static BASE64: [u8; 256] = {
    let mut table = [INVALID; 256];
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut i = 0;
    while i < 64 {
        table[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    table
};

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Quoted-printable's state between bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Qp {
    Plain,
    /// After `=`.
    Eq,
    /// After `=` and one hex digit.
    Hex1(u8),
}

/// A decoder of one part, fed its encoded bytes in any pieces.
#[derive(Debug)]
pub struct Decoder {
    transfer: Transfer,
    /// The part ends at a multipart boundary (not at the end of the message).
    in_multipart: bool,
    /// Encoded bytes fed so far.
    offset: u64,
    /// The previous byte fed.
    last: u8,
    // base64: the group so far and how many of its 4 characters.
    group: u32,
    count: u8,
    // quoted-printable.
    qp: Qp,
    crlf: bool,
    /// Trailing whitespace bytes at the end of `held`.
    ws: usize,
    /// Decoded bytes not sent yet: the trailing whitespace, and two more
    /// (what the end of a multipart part may take back).
    held: Vec<u8>,
}

impl Decoder {
    /// A decoder of a `transfer`-encoded part; `in_multipart` when the part
    /// is a child of a multipart (where mail-parser ends it at the boundary).
    pub fn new(transfer: Transfer, in_multipart: bool) -> Self {
        Self {
            transfer,
            in_multipart,
            offset: 0,
            last: if transfer == Transfer::Base64 { b'\n' } else { 0 },
            group: 0,
            count: 0,
            qp: Qp::Plain,
            crlf: false,
            ws: 0,
            held: Vec::new(),
        }
    }

    /// The decoded bytes of the next piece of the part that are final.
    pub fn feed(&mut self, input: &[u8]) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::with_capacity(input.len());
        match self.transfer {
            Transfer::Identity => out.extend_from_slice(input),
            Transfer::Base64 => self.base64(input, &mut out)?,
            Transfer::QuotedPrintable => {
                self.quoted_printable(input)?;
                self.release(&mut out);
            }
        }
        self.offset += input.len() as u64;
        Ok(out)
    }

    /// The last decoded bytes, once the whole part has been fed.
    pub fn finish(&mut self) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::new();
        if self.transfer == Transfer::QuotedPrintable {
            if self.in_multipart {
                // mail-parser sees the line break and `--boundary`, and
                // takes back the line break and the first dash it decoded.
                self.quoted_printable(b"\r\n-")?;
                let keep = self.held.len().saturating_sub(3);
                self.held.truncate(keep);
            }
            out.append(&mut self.held);
            self.ws = 0;
        }
        Ok(out)
    }

    fn base64(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
        let mut i = 0;
        while i < input.len() {
            if self.count == 0 {
                // Whole groups of base64 characters (a line's worth) at once.
                let run = input[i..].iter().take_while(|b| BASE64[usize::from(**b)] != INVALID).count() / 4 * 4;
                if run > 0 {
                    let offset = self.offset + i as u64;
                    base64::engine::general_purpose::STANDARD_NO_PAD
                        .decode_vec(&input[i..i + run], out)
                        .map_err(|_| DecodeError::Base64 { offset, byte: input[i] })?;
                    self.last = input[i + run - 1];
                    i += run;
                    continue;
                }
            }
            let ch = input[i];
            let value = BASE64[usize::from(ch)];
            if value != INVALID {
                if self.count == 0 {
                    self.group = 0;
                }
                self.group |= u32::from(value) << (18 - 6 * u32::from(self.count));
                self.count = (self.count + 1) & 3;
                if self.count == 0 {
                    out.extend_from_slice(&self.group.to_be_bytes()[1..]);
                }
            } else {
                match ch {
                    b'=' => {
                        let [_, a, b, _] = self.group.to_be_bytes();
                        match self.count {
                            1 | 2 => out.push(a),
                            3 => out.extend_from_slice(&[a, b]),
                            _ => {}
                        }
                        self.count = 0;
                    }
                    b'\n' | b' ' | b'\t' | b'\r' => {}
                    // A lone dash is skipped; two begin a boundary, which
                    // a part fetched alone never holds.
                    b'-' if self.last != b'-' => {}
                    byte => return Err(DecodeError::Base64 { offset: self.offset + i as u64, byte }),
                }
            }
            self.last = ch;
            i += 1;
        }
        Ok(())
    }

    fn push(&mut self, b: u8) {
        self.held.push(b);
    }

    fn quoted_printable(&mut self, input: &[u8]) -> Result<(), DecodeError> {
        for (i, &ch) in input.iter().enumerate() {
            match ch {
                b'=' => {
                    if self.qp != Qp::Plain {
                        return Err(DecodeError::QuotedPrintable { offset: self.offset + i as u64 });
                    }
                    self.qp = Qp::Eq;
                }
                b'\n' => {
                    if self.qp == Qp::Eq {
                        // A soft line break.
                        self.qp = Qp::Plain;
                    } else {
                        let keep = self.held.len() - self.ws;
                        self.held.truncate(keep);
                        if self.crlf {
                            self.held.extend_from_slice(b"\r\n");
                        } else {
                            self.held.push(b'\n');
                        }
                    }
                    self.ws = 0;
                }
                b'\r' => self.crlf = true,
                _ => match self.qp {
                    Qp::Plain => {
                        if ch.is_ascii_whitespace() {
                            self.ws += 1;
                        } else {
                            self.ws = 0;
                        }
                        self.push(ch);
                    }
                    Qp::Eq => {
                        if let Some(h) = hex(ch) {
                            self.qp = Qp::Hex1(h);
                        } else if !ch.is_ascii_whitespace() {
                            self.qp = Qp::Plain;
                            self.push(b'=');
                            self.push(ch);
                            self.ws = 0;
                        }
                    }
                    Qp::Hex1(h) => {
                        self.qp = Qp::Plain;
                        match hex(ch) {
                            Some(l) => self.push((h << 4) | l),
                            None => {
                                let last = self.last;
                                self.push(b'=');
                                self.push(last);
                                self.push(ch);
                            }
                        }
                        self.ws = 0;
                    }
                },
            }
            self.last = ch;
        }
        Ok(())
    }

    /// Sends what no later byte can take back.
    fn release(&mut self, out: &mut Vec<u8>) {
        if self.ws > MAX_HELD {
            // Too much to hold: it is sent, and no longer counts as trailing.
            self.ws = 0;
        }
        let keep = (self.ws + 2).min(self.held.len());
        out.extend(self.held.drain(..self.held.len() - keep));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mail_parser::{MessageParser, PartType};
    use proptest::prelude::*;

    /// The part decoded in pieces cut at `cuts`.
    fn decoded(transfer: Transfer, in_multipart: bool, encoded: &[u8], cuts: &[usize]) -> Result<Vec<u8>, DecodeError> {
        let mut d = Decoder::new(transfer, in_multipart);
        let mut out = Vec::new();
        let mut start = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (encoded.len() + 1)).collect();
        cuts.sort_unstable();
        for cut in cuts.into_iter().chain([encoded.len()]) {
            out.extend(d.feed(&encoded[start..cut.max(start)])?);
            start = cut.max(start);
        }
        out.extend(d.finish()?);
        Ok(out)
    }

    /// What mail-parser makes of the part: `None` when it finds an encoding problem.
    fn mail_parser(encoding: &str, in_multipart: bool, encoded: &[u8]) -> Option<Vec<u8>> {
        let head = format!("Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: {encoding}\r\n\r\n");
        let raw = if in_multipart {
            let mut raw = b"Content-Type: multipart/mixed; boundary=\"bnd\"\r\n\r\n--bnd\r\n".to_vec();
            raw.extend(head.as_bytes());
            raw.extend(encoded);
            raw.extend(b"\r\n--bnd--\r\n");
            raw
        } else {
            let mut raw = b"Subject: x\r\n".to_vec();
            raw.extend(head.as_bytes());
            raw.extend(encoded);
            raw
        };
        let message = MessageParser::default().parse(&raw)?;
        let part = message.part(if in_multipart { 1 } else { 0 })?;
        match &part.body {
            PartType::Binary(b) | PartType::InlineBinary(b) => Some(b.to_vec()),
            _ => None,
        }
    }

    fn same_as_mail_parser(transfer: Transfer, encoded: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
        let name = match transfer {
            Transfer::Base64 => "base64",
            Transfer::QuotedPrintable => "quoted-printable",
            Transfer::Identity => "8bit",
        };
        for in_multipart in [true, false] {
            let ours = decoded(transfer, in_multipart, encoded, cuts);
            // mail-parser's own arithmetic overflows on a part that is only
            // `=` before its boundary (it takes back more than it wrote): no
            // reference to hold to then.
            let Ok(theirs) = std::panic::catch_unwind(|| mail_parser(name, in_multipart, encoded)) else { continue };
            match theirs {
                Some(theirs) => prop_assert_eq!(ours, Ok(theirs), "in a multipart: {}", in_multipart),
                None => prop_assert!(ours.is_err(), "mail-parser found a problem, we did not: {:?}", ours),
            }
        }
        Ok(())
    }

    #[test]
    fn base64_across_any_cut() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 256) as u8).collect();
        let encoded = base64::engine::general_purpose::STANDARD.encode(&data);
        let lines: Vec<&[u8]> = encoded.as_bytes().chunks(76).collect();
        let encoded = lines.join(&b"\r\n"[..]);
        for cut in [0, 1, 2, 3, 75, 76, 77, 78, 79, 1001] {
            assert_eq!(decoded(Transfer::Base64, true, &encoded, &[cut, cut + 1, cut + 5]).unwrap(), data);
        }
        let e = decoded(Transfer::Base64, true, b"AAAA*AAA", &[]).unwrap_err();
        assert_eq!(e, DecodeError::Base64 { offset: 4, byte: b'*' });
    }

    #[test]
    fn quoted_printable_carries_escapes_soft_breaks_and_trailing_space() {
        let encoded = b"caf=C3=A9 au lait  \r\nsoft=\r\nbreak =3D ok=\r\n";
        for cut in 0..encoded.len() {
            let got = decoded(Transfer::QuotedPrintable, true, encoded, &[cut]).unwrap();
            assert_eq!(String::from_utf8(got).unwrap(), "café au lait\r\nsoftbreak = ok", "cut at {cut}");
        }
    }

    #[test]
    fn whitespace_held_back_is_bounded() {
        let mut d = Decoder::new(Transfer::QuotedPrintable, true);
        let spaces = vec![b' '; 3 * MAX_HELD];
        let out = d.feed(&spaces).unwrap();
        assert!(out.len() >= 2 * MAX_HELD && d.held.len() <= 2, "{} sent, {} held", out.len(), d.held.len());
    }

    proptest! {
        #[test]
        fn base64_is_decoded_as_mail_parser_decodes_it(
            encoded in proptest::collection::vec(prop::sample::select(
                b"AQgw+/z09=\r\n \t-*".to_vec()), 0..300),
            cuts in proptest::collection::vec(0usize..400, 0..6),
        ) {
            same_as_mail_parser(Transfer::Base64, &encoded, &cuts)?;
        }

        #[test]
        fn quoted_printable_is_decoded_as_mail_parser_decodes_it(
            encoded in proptest::collection::vec(prop::sample::select(
                b"aZ=09AFf \t\r\n\r\n\x0c\xc3".to_vec()), 0..300),
            cuts in proptest::collection::vec(0usize..400, 0..6),
        ) {
            same_as_mail_parser(Transfer::QuotedPrintable, &encoded, &cuts)?;
        }

        #[test]
        fn real_base64_with_odd_line_lengths_is_decoded(
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            width in 1usize..100,
            cuts in proptest::collection::vec(0usize..3000, 0..6),
        ) {
            let encoded = base64::engine::general_purpose::STANDARD.encode(&data);
            let lines: Vec<&[u8]> = encoded.as_bytes().chunks(width).collect();
            let encoded = lines.join(&b"\r\n"[..]);
            prop_assert_eq!(decoded(Transfer::Base64, true, &encoded, &cuts), Ok(data));
            same_as_mail_parser(Transfer::Base64, &encoded, &cuts)?;
        }
    }
}
