//! `application/x-www-form-urlencoded` bodies, read without decoding what is not asked for.
//!
//! Slack posts an interaction as one form field, `payload`, whose value is a percent-encoded JSON
//! document of a few kilobytes. `form_urlencoded::parse` decodes every name and value it walks
//! past (and then checks the result is UTF-8), so looking for one field decoded the whole body,
//! and the `ssl_check` probe test decoded it once more. Here the pairs are split as raw bytes and
//! only the names compared and the one value wanted are decoded, in one pass.
//!
//! The decoding is `form_urlencoded`'s: `+` is a space, `%` and two hex digits is that byte, and
//! a `%` not followed by two hex digits stays as it is. This module must not do I/O.
use std::borrow::Cow;

/// The `name=value` pairs of a form body, neither decoded. Empty pairs (`a=1&&b=2`) are skipped
/// and a pair without `=` has an empty value, as `form_urlencoded::parse` does.
pub fn pairs(body: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    memchr::memchr_iter(b'&', body)
        .chain(std::iter::once(body.len()))
        .scan(0, |start, end| {
            let pair = &body[*start..end];
            *start = end + 1;
            Some(pair)
        })
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.iter().position(|&b| b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &pair[pair.len()..]),
        })
}

/// The decoded value of the first field whose decoded name is `name`.
pub fn field<'a>(body: &'a [u8], name: &str) -> Option<Cow<'a, [u8]>> {
    pairs(body)
        .find(|(key, _)| decode(key).as_ref() == name.as_bytes())
        .map(|(_, value)| decode(value))
}

/// Decodes one name or value; borrowed when there is nothing to decode.
///
/// One pass over the bytes with a table for the hex digits. An interaction's payload is JSON,
/// where every quote, colon and brace is an escape (about one byte in five): looking for the
/// next escape with `memchr` costs a call per escape, which made this the largest part of a
/// click's parsing. (Reading eight bytes as a word and handling only its first escape on its
/// own took as many instructions and no less time.)
pub fn decode(raw: &[u8]) -> Cow<'_, [u8]> {
    // Most names and a command's values are a few bytes: a plain loop finds their first
    // escape sooner than `memchr2` gets started.
    let first = if raw.len() < SHORT {
        raw.iter().position(|&b| b == b'%' || b == b'+')
    } else {
        memchr::memchr2(b'%', b'+', raw)
    };
    let Some(first) = first else {
        return Cow::Borrowed(raw);
    };
    // The output is never longer than the input: write into a buffer of that length by index
    // and cut it to what was written.
    let mut out = vec![0; raw.len()];
    out[..first].copy_from_slice(&raw[..first]);
    let (mut from, mut to) = (first, first);
    while let Some(&byte) = raw.get(from) {
        let (value, width) = match byte {
            b'+' => (b' ', 1),
            b'%' => match raw.get(from + 1..from + 3) {
                Some(&[high, low]) if (HEX[high as usize] | HEX[low as usize]) < 16 => {
                    (HEX[high as usize] << 4 | HEX[low as usize], 3)
                }
                _ => (b'%', 1),
            },
            _ => (byte, 1),
        };
        out[to] = value;
        to += 1;
        from += width;
    }
    out.truncate(to);
    Cow::Owned(out)
}

/// Below this many bytes a name or value is searched byte by byte.
const SHORT: usize = 32;

/// A hex digit's value (either case), or 0xff for any other byte. Also reads the signature's
/// digest (`slack::signature`).
pub(super) const HEX: [u8; 256] = {
    let mut table = [0xff; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    /// What `form_urlencoded::parse` makes of `body`, as bytes (invalid UTF-8 replaced).
    fn reference(body: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        form_urlencoded::parse(body)
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    /// Ours, with invalid UTF-8 replaced as the reference does.
    fn ours(body: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let lossy = |b: Cow<'_, [u8]>| String::from_utf8_lossy(&b).into_owned().into_bytes();
        pairs(body)
            .map(|(k, v)| (lossy(decode(k)), lossy(decode(v))))
            .collect()
    }

    #[test]
    fn decodes_as_form_urlencoded_does() {
        let bodies: &[&[u8]] = &[
            b"",
            b"a=1",
            b"a=1&b=2",
            b"a=1&&b=2&",
            b"&&",
            b"novalue&x=",
            b"=only",
            b"a=b=c",
            b"text=list+running&x=%2Fsandbox",
            b"p=%7B%22type%22%3A%22block_actions%22%7D",
            b"p=%7b%22a%22%3a1%7d",
            b"odd=%&odd2=%4&odd3=%zz&odd4=%4g&tail=%",
            b"plus=%2B+%2b",
            b"k%61y=v&pay%6Coad=%E2%9C%93",
            b"sp=a%20b+c",
        ];
        for body in bodies {
            agrees_with_reference(body);
        }
    }

    /// The next number of a fixed-seed generator (a 64-bit LCG), so a failing body repeats.
    fn step(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state
    }

    fn agrees_with_reference(body: &[u8]) {
        assert_eq!(
            ours(body),
            reference(body),
            "{}",
            String::from_utf8_lossy(body)
        );
    }

    #[test]
    fn agrees_with_form_urlencoded_on_many_generated_bodies() {
        // Bodies drawn from the bytes that matter (separators, escapes, hex digits and not).
        const ALPHABET: &[u8] = b"%%%++&&==aF09gz ";
        let mut state: u64 = 0x5eed;
        for _ in 0..20_000 {
            let draw = step(&mut state);
            let len = (draw >> 59) as usize;
            let body: Vec<u8> = (0..len)
                .map(|i| ALPHABET[((draw >> (i * 4 % 56)) & 15) as usize])
                .collect();
            agrees_with_reference(&body);
        }
    }

    #[test]
    fn agrees_with_form_urlencoded_on_long_json_like_values() {
        // Values up to 255 bytes drawn mostly from what a JSON payload escapes, ending anywhere
        // (a `%` with one or no hex digit left included).
        const ALPHABET: &[u8] = b"%%%++aF09gz \"{:,";
        let mut state: u64 = 0xb0d1e5;
        for _ in 0..5_000 {
            let len = (step(&mut state) >> 56) as usize;
            let mut value = b"payload=".to_vec();
            value.extend(
                (0..len).map(|_| ALPHABET[(step(&mut state) >> 60) as usize % ALPHABET.len()]),
            );
            agrees_with_reference(&value);
        }
    }

    #[test]
    fn every_byte_round_trips_through_the_encoder() {
        let all: Vec<u8> = (0..=255u8).filter(|b| b.is_ascii()).collect();
        let text = String::from_utf8(all).unwrap() + "✓ é";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &text)
            .append_pair("payload", "second")
            .finish();
        assert_eq!(
            field(body.as_bytes(), "payload").as_deref(),
            Some(text.as_bytes())
        );
    }

    #[test]
    fn a_field_is_found_by_its_decoded_name_and_borrowed_when_plain() {
        assert_eq!(
            field(b"x=1&pay%6Coad=a+b", "payload").as_deref(),
            Some(&b"a b"[..])
        );
        assert!(matches!(
            field(b"payload=plain", "payload"),
            Some(Cow::Borrowed(b"plain"))
        ));
        assert_eq!(field(b"payloads=1&xpayload=2", "payload"), None);
        assert_eq!(field(b"payload", "payload").as_deref(), Some(&b""[..]));
    }
}
