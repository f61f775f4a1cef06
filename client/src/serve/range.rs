//! The `Range` request header (RFC 9110 §14.1.2), one byte range.

/// What a `Range` header asks of a blob of a known size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wanted {
    /// The whole blob: no header, a unit other than bytes, a malformed or a
    /// multi-range header (a server may ignore those and answer 200).
    Whole,
    /// `[offset, offset + len)`.
    Part(u64, u64),
    /// No byte of it exists: 416.
    Unsatisfiable,
}

/// Interprets `header` for a blob of `size` bytes.
pub(super) fn wanted(header: Option<&str>, size: u64) -> Wanted {
    let Some(h) = header else {
        return Wanted::Whole;
    };
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return Wanted::Whole;
    };
    if spec.contains(',') {
        return Wanted::Whole;
    }
    let num = |t: &str| {
        let t = t.trim();
        (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<u64>().ok())
            .flatten()
    };
    let Some((a, b)) = spec.split_once('-') else {
        return Wanted::Whole;
    };
    match (a.trim().is_empty(), num(a), num(b)) {
        // `-N`: the last N bytes.
        (true, _, Some(n)) if n > 0 && size > 0 => {
            let n = n.min(size);
            Wanted::Part(size - n, n)
        }
        (true, _, Some(_)) => Wanted::Unsatisfiable,
        (false, Some(start), end) if b.trim().is_empty() || end.is_some() => {
            if start >= size {
                return Wanted::Unsatisfiable;
            }
            match end {
                Some(e) if e < start => Wanted::Whole,
                Some(e) => Wanted::Part(start, e.min(size - 1) - start + 1),
                None => Wanted::Part(start, size - start),
            }
        }
        _ => Wanted::Whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_of_rfc_9110() {
        let w = |h: &str| wanted(Some(h), 1000);
        assert_eq!(wanted(None, 1000), Wanted::Whole);
        assert_eq!(w("bytes=0-499"), Wanted::Part(0, 500));
        assert_eq!(w("bytes=500-"), Wanted::Part(500, 500));
        assert_eq!(w("bytes=-100"), Wanted::Part(900, 100));
        assert_eq!(w("bytes=-5000"), Wanted::Part(0, 1000));
        assert_eq!(w("bytes=990-5000"), Wanted::Part(990, 10));
        assert_eq!(w("bytes=1000-"), Wanted::Unsatisfiable);
        assert_eq!(w("bytes=1000-1001"), Wanted::Unsatisfiable);
        assert_eq!(w("bytes=-0"), Wanted::Unsatisfiable);
        assert_eq!(wanted(Some("bytes=-1"), 0), Wanted::Unsatisfiable);
        for ignored in [
            "items=0-1",
            "bytes=5-3",
            "bytes=a-b",
            "bytes=0-1,5-6",
            "bytes=",
            "bytes=-",
            "bytes=1",
            "bytes=+1-2",
        ] {
            assert_eq!(w(ignored), Wanted::Whole, "{ignored}");
        }
    }
}
