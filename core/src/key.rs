use std::fmt;
use std::str::FromStr;

/// Length of a key in bytes (a BLAKE3-256 digest).
pub const KEY_LEN: usize = 32;

/// A content key: the BLAKE3 hash of a blob's bytes.
///
/// Written as 64 lowercase hexadecimal characters. Two puts of the same bytes
/// produce the same key, which is what makes the store deduplicating and
/// immutable: a key names exactly one content, forever.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key([u8; KEY_LEN]);

/// Why a string or byte slice is not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The hex form had the wrong number of characters.
    #[error("a key is 64 hex characters, got {len}: {shown}")]
    HexLength {
        /// Characters supplied.
        len: usize,
        /// The input, shortened for display.
        shown: String,
    },
    /// The hex form contained a character that is not `0-9a-f`.
    #[error("a key is lowercase hex (0-9a-f); {found:?} at position {position} is not")]
    NotHex {
        /// The offending character.
        found: char,
        /// Its character position.
        position: usize,
    },
    /// The binary form had the wrong number of bytes.
    #[error("a key is 32 bytes, got {0}")]
    ByteLength(usize),
}

impl Key {
    /// The key of `bytes`: their BLAKE3 hash.
    pub fn of(bytes: &[u8]) -> Key {
        Key(*blake3::hash(bytes).as_bytes())
    }

    /// Wraps a finished hash.
    pub fn from_hash(hash: blake3::Hash) -> Key {
        Key(*hash.as_bytes())
    }

    /// Wraps raw key bytes.
    pub const fn from_bytes(bytes: [u8; KEY_LEN]) -> Key {
        Key(bytes)
    }

    /// Parses 32 raw bytes (as stored in a database column).
    pub fn from_slice(bytes: &[u8]) -> Result<Key, KeyError> {
        let arr: [u8; KEY_LEN] = bytes
            .try_into()
            .map_err(|_| KeyError::ByteLength(bytes.len()))?;
        Ok(Key(arr))
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The 64-character lowercase hex form.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }

    /// Parses the hex form. Uppercase is refused so that one key has exactly
    /// one spelling (it is also a file name on disk).
    pub fn parse(s: &str) -> Result<Key, KeyError> {
        let len = s.chars().count();
        if len != KEY_LEN * 2 || s.len() != KEY_LEN * 2 {
            let shown: String = s.chars().take(80).collect();
            return Err(KeyError::HexLength { len, shown });
        }
        let bytes = s.as_bytes();
        let mut out = [0u8; KEY_LEN];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = nibble(pair[0]).ok_or(KeyError::NotHex {
                found: pair[0] as char,
                position: 2 * i,
            })?;
            let lo = nibble(pair[1]).ok_or(KeyError::NotHex {
                found: pair[1] as char,
                position: 2 * i + 1,
            })?;
            out[i] = (hi << 4) | lo;
        }
        Ok(Key(out))
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl FromStr for Key {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Key, KeyError> {
        Key::parse(s)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; KEY_LEN * 2];
        for (i, b) in self.0.iter().enumerate() {
            buf[2 * i] = HEX[(b >> 4) as usize];
            buf[2 * i + 1] = HEX[(b & 0xf) as usize];
        }
        // The buffer holds only ASCII hex digits.
        f.write_str(std::str::from_utf8(&buf).expect("hex is ascii"))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

/// Keys serialize as their 64-character hex form.
#[cfg(feature = "serde")]
impl serde::Serialize for Key {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl AsRef<[u8]> for Key {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_known_vector() {
        // BLAKE3 of the empty input, from the reference test vectors.
        let k = Key::of(b"");
        assert_eq!(
            k.to_hex(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(Key::parse(&k.to_hex()).unwrap(), k);
        assert_eq!(Key::from_slice(k.as_bytes()).unwrap(), k);
    }

    #[test]
    fn malformed_keys_are_typed_errors() {
        assert!(matches!(
            Key::parse(""),
            Err(KeyError::HexLength { len: 0, .. })
        ));
        assert!(matches!(
            Key::parse(&"a".repeat(63)),
            Err(KeyError::HexLength { len: 63, .. })
        ));
        let upper = "AF1349B9F5F9A1A6A0404DEA36DCC9499BCB25C9ADC112B7CC9A93CAE41F3262";
        assert_eq!(
            Key::parse(upper),
            Err(KeyError::NotHex {
                found: 'A',
                position: 0
            })
        );
        let mut s = "0".repeat(64);
        s.replace_range(10..11, "g");
        assert_eq!(
            Key::parse(&s),
            Err(KeyError::NotHex {
                found: 'g',
                position: 10
            })
        );
        // Multi-byte characters must not be mistaken for the right length.
        let tricky = format!("{}é", "0".repeat(62));
        assert!(matches!(
            Key::parse(&tricky),
            Err(KeyError::HexLength { .. })
        ));
        assert!(matches!(
            Key::parse("../../etc/passwd"),
            Err(KeyError::HexLength { .. })
        ));
        assert_eq!(Key::from_slice(&[0u8; 31]), Err(KeyError::ByteLength(31)));
    }

    #[test]
    fn order_is_byte_order() {
        let a = Key::from_bytes([0u8; 32]);
        let mut b = [0u8; 32];
        b[0] = 1;
        let b = Key::from_bytes(b);
        assert!(a < b);
        assert!(a.to_hex() < b.to_hex());
    }
}
