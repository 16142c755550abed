//! Fuzz targets of the SSE reader: the network may cut a stream anywhere, so any chunking
//! of a body must give the events of the body whole; garbage must end in an error.

use futures_util::FutureExt;
use proptest::collection::vec;
use proptest::prelude::*;

use super::*;
use frugal_testkit::fuzz::cases;

/// What `sse_frames` makes of `body` cut at `cuts` (offsets, any order).
fn read(body: &[u8], cuts: &[usize], max_event: usize) -> Vec<Result<String, String>> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    at.push(0);
    at.push(body.len());
    at.sort_unstable();
    at.dedup();
    let chunks: Vec<Result<Vec<u8>, String>> = at
        .windows(2)
        .map(|w| Ok(body[w[0]..w[1]].to_vec()))
        .collect();
    sse_frames(futures_util::stream::iter(chunks), max_event)
        .collect::<Vec<_>>()
        .now_or_never()
        .unwrap()
}

/// An event as an OpenAI-compatible server writes it: optional `event:`/`id:` lines and
/// comments around one or more `data:` lines, ended by a blank line (LF or CRLF).
#[derive(Debug, Clone)]
struct Event {
    data: Vec<String>,
    before: Option<String>,
    space: bool,
    crlf: bool,
}

impl Event {
    fn write(&self, out: &mut Vec<u8>) {
        let eol: &[u8] = if self.crlf { b"\r\n" } else { b"\n" };
        if let Some(line) = &self.before {
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(eol);
        }
        for d in &self.data {
            out.extend_from_slice(if self.space { b"data: " } else { b"data:" });
            out.extend_from_slice(d.as_bytes());
            out.extend_from_slice(eol);
        }
        out.extend_from_slice(eol);
    }
}

fn event() -> impl Strategy<Value = Event> {
    // Payloads as JSON chunks are: no line breaks, no leading blank.
    let payload = "[^\r\n \t]([^\r\n]{0,30})?|\\{\"choices\":\\[\\{\"delta\":\\{\"content\":\"[^\r\n\"]{0,12}\"\\}\\}\\]\\}";
    let before = proptest::option::of(prop_oneof![
        Just(": keep-alive".to_owned()),
        Just("event: message".to_owned()),
        "id: [0-9]{1,4}",
    ]);
    (vec(payload, 1..3), before, any::<bool>(), any::<bool>()).prop_map(
        |(data, before, space, crlf)| Event {
            data,
            before,
            space,
            crlf,
        },
    )
}

const CLOSED: &str = "the upstream closed the stream before [DONE]";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_sse_chunking", 400)))]

    /// Any chunking of a stream of events gives each event's data, in order, and then the
    /// close; and the same as the stream in one chunk, also when an event is too large.
    #[test]
    fn fuzz_sse_chunking(
        events in vec(event(), 0..6),
        cuts in vec(any::<usize>(), 0..12),
        max_event in prop_oneof![Just(1usize << 20), 1usize..120],
    ) {
        let mut body = Vec::new();
        for e in &events {
            e.write(&mut body);
        }
        let whole = read(&body, &[], max_event);
        let chunked = read(&body, &cuts, max_event);
        prop_assert_eq!(&chunked, &whole);
        if max_event == 1 << 20 {
            let mut want: Vec<Result<String, String>> =
                events.iter().map(|e| Ok(e.data.join("\n"))).collect();
            want.push(Err(CLOSED.to_owned()));
            prop_assert_eq!(&whole, &want);
        }
        // Nothing past the limit is handed on.
        for e in whole.iter().flatten() {
            prop_assert!(e.len() <= max_event, "{} bytes past {max_event}", e.len());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_sse_garbage", 400)))]

    /// Bytes of any kind, weighted to the format's own, in any chunks: as read whole, a
    /// finite list of events within the limit that ends in exactly one error.
    #[test]
    fn fuzz_sse_garbage(
        parts in vec(prop_oneof![
            Just(b"data:".to_vec()), Just(b"\n".to_vec()), Just(b"\r\n".to_vec()),
            Just(b"\r".to_vec()), Just(b" ".to_vec()), Just(b"\xff".to_vec()),
            Just(b"\xe2\x82".to_vec()), vec(any::<u8>(), 0..16),
        ], 0..40),
        cuts in vec(any::<usize>(), 0..12),
        max_event in prop_oneof![Just(1usize << 20), 1usize..64],
    ) {
        let body = parts.concat();
        let out = read(&body, &cuts, max_event);
        prop_assert_eq!(&out, &read(&body, &[], max_event));
        let (last, events) = out.split_last().unwrap();
        prop_assert!(last.is_err());
        // The limit is on the bytes received; each byte of invalid UTF-8 reads as U+FFFD,
        // three bytes of text.
        for e in events {
            let e = e.as_ref().map_err(|e| TestCaseError::fail(e.clone()))?;
            prop_assert!(e.len() <= 3 * max_event);
        }
    }
}

/// A real stream (a frugal gateway's, two chunks and the usage) cut at every byte reads as
/// it does whole.
#[test]
fn fuzz_sse_real_stream_cut_everywhere() {
    let body = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1765000000,\"model\":\"smollm2\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hé\"},\"finish_reason\":null}]}\n\n",
        ": keep-alive\r\n\r\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\r\n\r\n",
        "data: [DONE]\n\n",
    )
    .as_bytes();
    let whole = read(body, &[], 1 << 20);
    assert_eq!(whole.len(), 4, "{whole:?}");
    assert_eq!(whole[2], Ok("[DONE]".to_owned()));
    for a in 0..=body.len() {
        for b in [a + 1, a + 7, body.len() - a] {
            assert_eq!(read(body, &[a, b], 1 << 20), whole, "cut at {a} and {b}");
        }
    }
}

/// An event over the limit used to pass when it came in one chunk and fail when cut (one
/// event `data: 0123456789`, a limit of 10 bytes, a cut at byte 12), and one at the limit
/// failed when its blank line came in a later chunk; `fuzz_sse_chunking` checks the same for
/// any stream. The limit is the event's own size now.
#[test]
fn fuzz_sse_found_limit_is_the_same_however_cut() {
    let body = b"data: 0123456789\n\n";
    for max in [10, 15, 16, 17] {
        let whole = read(body, &[], max);
        for cut in 0..body.len() {
            assert_eq!(read(body, &[cut], max), whole, "limit {max}, cut at {cut}");
        }
    }
    assert_eq!(
        read(body, &[], 15)[0],
        Err("the upstream sent an event larger than 15 bytes".to_owned())
    );
    assert_eq!(read(body, &[], 16)[0], Ok("0123456789".to_owned()));
}

/// A 1 MiB event that arrives a byte at a time is read in time linear in its size: each
/// chunk used to rescan the whole event so far (minutes for this one).
#[test]
fn fuzz_sse_one_byte_chunks() {
    let mut body = b"data: ".to_vec();
    body.extend(std::iter::repeat_n(b'x', 1 << 20));
    body.extend(b"\r\n\r\n");
    let chunks: Vec<Result<[u8; 1], String>> = body.iter().map(|b| Ok([*b])).collect();
    let out = sse_frames(futures_util::stream::iter(chunks), 4 << 20)
        .collect::<Vec<_>>()
        .now_or_never()
        .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].as_ref().map(String::len), Ok(1 << 20));
}

/// Found by `fuzz_sse_chunking` (minimal: `data:\u{b}`, read as an empty payload): only the
/// one space after `data:` separates; other leading blanks are the payload's.
#[test]
fn fuzz_sse_found_one_space_separates() {
    let body = b"data:\x0bx\n\ndata:  two\n\ndata:none\n\n";
    let out = read(body, &[], 1 << 20);
    assert_eq!(
        out[..3],
        [
            Ok("\u{b}x".to_owned()),
            Ok(" two".to_owned()),
            Ok("none".to_owned())
        ]
    );
}
