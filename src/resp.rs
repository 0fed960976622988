//! A minimal RESP2 reader and writer for the pub/sub connection.
//!
//! The subscriber thread owns the read side of its socket while other threads write
//! `SUBSCRIBE`/`UNSUBSCRIBE` on a clone of it, so that a waiter's subscription goes out at once
//! instead of queueing behind a blocked read. That needs a reader whose buffering is visible
//! (`BufReader::buffer`): an idle read timeout is harmless only between replies, never inside
//! one. This reader keeps every unread byte in the `BufReader`, so the caller can tell.

use std::io::{self, BufRead, Read};

/// The largest bulk string accepted (channel names are short; payloads are one word).
const MAX_BULK: usize = 64 * 1024 * 1024;
/// The largest array accepted.
const MAX_ARRAY: usize = 1024;
/// The deepest nesting accepted.
const MAX_DEPTH: u32 = 4;

/// One RESP2 value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resp {
    /// `+OK`
    Simple(Vec<u8>),
    /// `-ERR ...`
    Error(String),
    /// `:1`
    Int(i64),
    /// `$3\r\nfoo` or the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...` or the null array.
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The bytes of a simple or bulk string.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self {
            Resp::Simple(b) | Resp::Bulk(Some(b)) => Some(b),
            _ => None,
        }
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad RESP reply: {msg}"))
}

fn read_line(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::with_capacity(32);
    r.take(64 * 1024).read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if !line.ends_with(b"\r\n") {
        return Err(invalid("line without CRLF"));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn parse_int(b: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("bad integer"))
}

/// Reads one complete value.
pub(crate) fn read(r: &mut impl BufRead) -> io::Result<Resp> {
    read_at(r, 0)
}

fn read_at(r: &mut impl BufRead, depth: u32) -> io::Result<Resp> {
    let line = read_line(r)?;
    let (kind, rest) = line.split_first().ok_or_else(|| invalid("empty line"))?;
    match kind {
        b'+' => Ok(Resp::Simple(rest.to_vec())),
        b'-' => Ok(Resp::Error(String::from_utf8_lossy(rest).into_owned())),
        b':' => Ok(Resp::Int(parse_int(rest)?)),
        b'$' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(Resp::Bulk(None));
            }
            let n = usize::try_from(n).map_err(|_| invalid("bulk length"))?;
            if n > MAX_BULK {
                return Err(invalid("bulk string too long"));
            }
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf)?;
            if !buf.ends_with(b"\r\n") {
                return Err(invalid("bulk string without CRLF"));
            }
            buf.truncate(n);
            Ok(Resp::Bulk(Some(buf)))
        }
        b'*' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(Resp::Array(None));
            }
            let n = usize::try_from(n).map_err(|_| invalid("array length"))?;
            if n > MAX_ARRAY || depth >= MAX_DEPTH {
                return Err(invalid("array too large or too deep"));
            }
            let items = (0..n)
                .map(|_| read_at(r, depth + 1))
                .collect::<io::Result<Vec<_>>>()?;
            Ok(Resp::Array(Some(items)))
        }
        _ => Err(invalid("unknown type byte")),
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub(crate) fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    fn parse_all(bytes: &[u8]) -> io::Result<Vec<Resp>> {
        let mut r = BufReader::new(bytes);
        let mut out = Vec::new();
        while !r.fill_buf()?.is_empty() {
            out.push(read(&mut r)?);
        }
        Ok(out)
    }

    #[test]
    fn reads_pubsub_replies() {
        let bytes = b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$8\r\nreleased\r\n+PONG\r\n-ERR no\r\n$-1\r\n";
        let v = parse_all(bytes).unwrap_or_default();
        assert_eq!(v.len(), 5);
        assert_eq!(
            v[0],
            Resp::Array(Some(vec![
                Resp::Bulk(Some(b"subscribe".to_vec())),
                Resp::Bulk(Some(b"ch".to_vec())),
                Resp::Int(1)
            ]))
        );
        assert_eq!(v[2], Resp::Simple(b"PONG".to_vec()));
        assert_eq!(v[3], Resp::Error("ERR no".into()));
        assert_eq!(v[4], Resp::Bulk(None));
    }

    #[test]
    fn binary_and_unicode_channel_names_round_trip() {
        let name = "a b\n*?[{}]é名".as_bytes();
        let cmd = encode(&[b"SUBSCRIBE", name]);
        let v = parse_all(&cmd).unwrap_or_default();
        assert_eq!(
            v,
            vec![Resp::Array(Some(vec![
                Resp::Bulk(Some(b"SUBSCRIBE".to_vec())),
                Resp::Bulk(Some(name.to_vec()))
            ]))]
        );
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        for bad in [
            &b"?\r\n"[..],
            b"$5\r\nab\r\n",
            b":x\r\n",
            b"*99999999\r\n",
            b"+no crlf",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"$-7\r\n",
        ] {
            let _ = parse_all(bad);
        }
        assert!(parse_all(b"$5\r\nab\r\n").is_err());
        assert!(parse_all(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n").is_err());
    }
}
