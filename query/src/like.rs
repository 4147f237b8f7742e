//! `LIKE` patterns: `%` any run of characters, `_` one character, `[abc]`, `[a-z]` and
//! `[^...]` one of (or none of) a set, and an escape character before a wildcard to match it
//! as is.
//!
//! Matched by the classic wildcard walk that backtracks only to the last `%`: every part
//! between two `%` has a fixed length, so the leftmost place each part fits is the right one.
//! Its work is at most the text's length times the pattern's, and every step of it is counted
//! (see [`Like::matches`]), so a hostile pattern over a large text is stopped by the
//! document's evaluation budget or its caller's deadline instead of running for seconds.

use crate::error::QueryError;

/// One element of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// `%`.
    Any,
    /// `_`.
    One,
    Char(char),
    /// `[...]`: inclusive ranges (a single character is a range of one).
    Set {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    /// Comparisons one test of a character costs.
    fn cost(&self) -> u64 {
        match self {
            Token::Set { ranges, .. } => ranges.len().max(1) as u64,
            _ => 1,
        }
    }

    fn accepts(&self, c: char) -> bool {
        match self {
            Token::Any | Token::One => true,
            Token::Char(p) => *p == c,
            Token::Set { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
        }
    }
}

/// A compiled `LIKE` pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Like {
    tokens: Vec<Token>,
}

/// Comparisons counted as one evaluation step.
pub(crate) const COMPARISONS_PER_STEP: u64 = 64;

impl Like {
    pub(crate) fn compile(pattern: &str, escape: Option<char>) -> Result<Self, QueryError> {
        let mut tokens = Vec::new();
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            if Some(c) == escape {
                match chars.next() {
                    Some(next) => tokens.push(Token::Char(next)),
                    None => {
                        return Err(QueryError::invalid(
                            None,
                            "a LIKE pattern ends with its escape character",
                        ));
                    }
                }
                continue;
            }
            match c {
                // Runs of `%` are one.
                '%' if tokens.last() == Some(&Token::Any) => {}
                '%' => tokens.push(Token::Any),
                '_' => tokens.push(Token::One),
                '[' => {
                    let negated = chars.next_if_eq(&'^').is_some();
                    let mut raw = Vec::new();
                    let mut closed = false;
                    for d in chars.by_ref() {
                        if d == ']' {
                            closed = true;
                            break;
                        }
                        raw.push(d);
                    }
                    if closed && !raw.is_empty() {
                        tokens.push(Token::Set {
                            negated,
                            ranges: set_ranges(&raw),
                        });
                    } else {
                        // Not a set: the bracket text matches itself.
                        tokens.push(Token::Char('['));
                        if negated {
                            tokens.push(Token::Char('^'));
                        }
                        tokens.extend(raw.into_iter().map(Token::Char));
                        if closed {
                            tokens.push(Token::Char(']'));
                        }
                    }
                }
                c => tokens.push(Token::Char(c)),
            }
        }
        Ok(Like { tokens })
    }

    /// Whether the whole of `text` matches, calling `charge(n)` for every
    /// [`COMPARISONS_PER_STEP`] comparisons (a set's test costs one per range; its error stops
    /// the match).
    pub(crate) fn matches(
        &self,
        text: &str,
        mut charge: impl FnMut(u64) -> Result<(), QueryError>,
    ) -> Result<bool, QueryError> {
        let tokens = &self.tokens;
        let (mut t, mut s) = (0, 0);
        // After the last `%` met: the token after it, and where in the text it next tries.
        let mut resume: Option<(usize, usize)> = None;
        // Comparisons not yet charged.
        let mut work = 0u64;
        loop {
            work += tokens.get(t).map_or(1, Token::cost);
            if work >= COMPARISONS_PER_STEP {
                charge(work / COMPARISONS_PER_STEP)?;
                work %= COMPARISONS_PER_STEP;
            }
            match tokens.get(t) {
                Some(Token::Any) => {
                    t += 1;
                    resume = Some((t, s));
                    continue;
                }
                Some(token) => {
                    if let Some(c) = text[s..].chars().next()
                        && token.accepts(c)
                    {
                        t += 1;
                        s += c.len_utf8();
                        continue;
                    }
                }
                None if s == text.len() => return Ok(true),
                None => {}
            }
            // A mismatch: the last `%` takes one more character, or there is no match.
            let Some((after, from)) = resume else {
                return Ok(false);
            };
            let Some(c) = text[from..].chars().next() else {
                return Ok(false);
            };
            resume = Some((after, from + c.len_utf8()));
            (t, s) = (after, from + c.len_utf8());
        }
    }
}

/// The ranges of a set's characters: `a-c` is a range, a `-` first or last is itself.
fn set_ranges(raw: &[char]) -> Vec<(char, char)> {
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        if i + 2 < raw.len() && raw[i + 1] == '-' {
            let (lo, hi) = (raw[i], raw[i + 2]);
            // A reversed range holds nothing (the regular expressions used before refused
            // to compile one; an empty range is the closest that still runs).
            if lo <= hi {
                ranges.push((lo, hi));
            }
            i += 3;
        } else {
            ranges.push((raw[i], raw[i]));
            i += 1;
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    fn like(pattern: &str, text: &str, escape: Option<char>) -> bool {
        Like::compile(pattern, escape)
            .expect("compiles")
            .matches(text, |_| Ok(()))
            .expect("unlimited")
    }

    #[test]
    fn patterns() {
        assert!(like("a%", "abc", None));
        assert!(!like("a%", "bac", None));
        assert!(like("%", "", None));
        assert!(like("%%", "x", None));
        assert!(!like("_", "", None));
        assert!(like("_b_", "abc", None));
        assert!(like("_", "ü", None));
        assert!(like("[a-c]x", "bx", None));
        assert!(!like("[^a-c]x", "bx", None));
        assert!(like("[^a-c]x", "dx", None));
        assert!(like("[a-]", "-", None));
        assert!(like("100!%", "100%", Some('!')));
        assert!(!like("100!%", "1000", Some('!')));
        assert!(like("a.b", "a.b", None));
        assert!(!like("a.b", "axb", None));
        assert!(like("[x", "[x", None));
        assert!(like("[]", "[]", None));
        assert!(like("%a%b%c", "xxaxxbxxbxc", None));
        assert!(!like("%a%b%c", "xxaxxbxxbx", None));
        assert!(like("%abc", "ababc", None));
        assert!(like("a%b%c%", "a\nb\nc\n", None));
        assert!(like("%o W%", "Hello World", None));
        assert!(!like("hello%", "Hello", None), "case-sensitive");
    }

    #[test]
    fn a_hostile_pattern_is_charged_for_its_work() {
        let text = "a".repeat(100_000);
        let pattern = format!("%{}b", "_".repeat(500));
        let like = Like::compile(&pattern, None).expect("compiles");
        let mut charged = 0u64;
        let matched = like
            .matches(&text, |n| {
                charged += n;
                Ok(())
            })
            .expect("unlimited");
        assert!(!matched);
        // About 500 comparisons at each of 100,000 places.
        assert!(charged > 500 * 99_000 / COMPARISONS_PER_STEP, "{charged}");
        let stopped = like.matches(&text, |_| Err(QueryError::limit("budget spent")));
        assert!(stopped.is_err());
        // A set's test costs one comparison per range.
        let set: String = ('\u{100}'..'\u{300}').step_by(2).collect();
        let like = Like::compile(&format!("%[{set}]x"), None).expect("compiles");
        let mut charged = 0u64;
        like.matches(&text, |n| {
            charged += n;
            Ok(())
        })
        .expect("unlimited");
        assert!(charged >= 256 * 99_000 / COMPARISONS_PER_STEP, "{charged}");
    }
}
