//! Client input quoted back in error messages, cut short: a status message travels in HTTP/2
//! trailers (twice, with the error details), and gRPC-core clients turn trailers over their
//! 8 KiB limit into RESOURCE_EXHAUSTED, hiding the real error.

use std::fmt;

/// Characters of one piece of client input an error message repeats.
pub const ECHO_CHARS: usize = 128;

/// `{}` writes the input, `{:?}` writes it quoted and escaped; past [`ECHO_CHARS`] characters
/// either ends in `…(N more)`.
pub struct Echo<'a>(pub &'a str);

impl Echo<'_> {
    /// The part written, and how many characters are left out.
    fn split(&self) -> (&str, usize) {
        match self.0.char_indices().nth(ECHO_CHARS) {
            None => (self.0, 0),
            Some((at, _)) => (&self.0[..at], self.0[at..].chars().count()),
        }
    }

    fn write_rest(f: &mut fmt::Formatter<'_>, rest: usize) -> fmt::Result {
        if rest > 0 {
            write!(f, "…({rest} more)")?;
        }
        Ok(())
    }
}

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shown, rest) = self.split();
        f.write_str(shown)?;
        Self::write_rest(f, rest)
    }
}

impl fmt::Debug for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shown, rest) = self.split();
        write!(f, "{shown:?}")?;
        Self::write_rest(f, rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_input_is_cut_at_a_character_boundary_and_says_how_much_is_left_out() {
        assert_eq!(Echo("short").to_string(), "short");
        assert_eq!(format!("{:?}", Echo("a\"b")), "\"a\\\"b\"");
        let exact = "é".repeat(ECHO_CHARS);
        assert_eq!(Echo(&exact).to_string(), exact);
        let long = "é".repeat(10_000);
        let shown = Echo(&long).to_string();
        assert_eq!(shown, format!("{}…(9872 more)", "é".repeat(ECHO_CHARS)));
        assert_eq!(
            format!("{:?}", Echo(&long)),
            format!("\"{}\"…(9872 more)", "é".repeat(ECHO_CHARS))
        );
    }
}
