//! Query text to tokens, each with the line and column it starts at.

use std::fmt;

use crate::error::{Position, QueryError};

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Token {
    /// A name: keyword or identifier (keywords are recognised by the parser, case-insensitively,
    /// so that `c.value` or `c.select` stay property names).
    Word(String),
    /// `@name`.
    Param(String),
    Number(f64),
    Str(String),
    /// Punctuation and operators.
    Sym(&'static str),
    End,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Word(w) => write!(f, "'{w}'"),
            Token::Param(p) => write!(f, "parameter '@{p}'"),
            Token::Number(n) => write!(f, "number {n}"),
            Token::Str(_) => write!(f, "a string"),
            Token::Sym(s) => write!(f, "'{s}'"),
            Token::End => write!(f, "the end of the query"),
        }
    }
}

/// Operators and punctuation, longest first so that `>>>` wins over `>>` and `>`.
const SYMBOLS: &[&str] = &[
    ">>>", "<<", ">>", "<=", ">=", "!=", "<>", "||", "??", "(", ")", "[", "]", "{", "}", ",", ".",
    ":", "?", "*", "/", "%", "+", "-", "=", "<", ">", "&", "|", "^", "~",
];

/// Splits `text` into tokens; the last is always [`Token::End`].
pub(crate) fn tokenize(text: &str) -> Result<Vec<(Token, Position)>, QueryError> {
    let mut lexer = Lexer {
        chars: text.chars().collect(),
        at: 0,
        line: 1,
        column: 1,
    };
    let mut tokens = Vec::new();
    loop {
        lexer.skip_space_and_comments();
        let start = lexer.position();
        let Some(c) = lexer.peek(0) else {
            tokens.push((Token::End, start));
            return Ok(tokens);
        };
        let token = if c.is_ascii_digit()
            || (c == '.' && lexer.peek(1).is_some_and(|d| d.is_ascii_digit()))
        {
            lexer.number(start)?
        } else if c == '\'' || c == '"' {
            lexer.string(c, start)?
        } else if c == '@' {
            lexer.bump();
            let name = lexer.word();
            if name.is_empty() {
                return Err(QueryError::syntax(start, "a parameter name after '@'"));
            }
            Token::Param(name)
        } else if is_word_start(c) {
            Token::Word(lexer.word())
        } else if let Some(sym) = SYMBOLS.iter().find(|s| lexer.starts_with(s)) {
            for _ in 0..sym.len() {
                lexer.bump();
            }
            Token::Sym(sym)
        } else {
            return Err(QueryError::syntax_found(
                start,
                "a query",
                &format!("'{c}'"),
            ));
        };
        tokens.push((token, start));
    }
}

fn is_word_start(c: char) -> bool {
    c.is_alphabetic() || c == '_' || c == '$'
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    line: u32,
    column: u32,
}

impl Lexer {
    fn position(&self) -> Position {
        Position {
            line: self.line,
            column: self.column,
        }
    }

    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn starts_with(&self, s: &str) -> bool {
        s.chars().enumerate().all(|(i, c)| self.peek(i) == Some(c))
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn skip_space_and_comments(&mut self) {
        loop {
            match self.peek(0) {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                // `-- comment` to the end of the line.
                Some('-') if self.peek(1) == Some('-') => {
                    while self.peek(0).is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                _ => return,
            }
        }
    }

    fn word(&mut self) -> String {
        let mut word = String::new();
        while let Some(c) = self.peek(0).filter(|&c| is_word_char(c)) {
            word.push(c);
            self.bump();
        }
        word
    }

    fn number(&mut self, start: Position) -> Result<Token, QueryError> {
        if self.peek(0) == Some('0') && matches!(self.peek(1), Some('x' | 'X')) {
            self.bump();
            self.bump();
            let mut digits = String::new();
            while let Some(c) = self.peek(0).filter(char::is_ascii_hexdigit) {
                digits.push(c);
                self.bump();
            }
            return u64::from_str_radix(&digits, 16)
                .map(|n| Token::Number(n as f64))
                .map_err(|_| QueryError::syntax(start, "hexadecimal digits after '0x'"));
        }
        let mut text = String::new();
        let digits = |lexer: &mut Self, text: &mut String| {
            while let Some(c) = lexer.peek(0).filter(char::is_ascii_digit) {
                text.push(c);
                lexer.bump();
            }
        };
        digits(self, &mut text);
        if self.peek(0) == Some('.') && self.peek(1).is_some_and(|c| c.is_ascii_digit()) {
            text.push('.');
            self.bump();
            digits(self, &mut text);
        }
        if matches!(self.peek(0), Some('e' | 'E')) {
            let sign = matches!(self.peek(1), Some('+' | '-'));
            let digit_at = if sign { 2 } else { 1 };
            if self.peek(digit_at).is_some_and(|c| c.is_ascii_digit()) {
                text.push('e');
                self.bump();
                if sign {
                    text.extend(self.bump());
                }
                digits(self, &mut text);
            }
        }
        if self.peek(0).is_some_and(is_word_start) {
            return Err(QueryError::syntax_found(
                self.position(),
                "an operator or space after a number",
                &format!("'{}'", self.peek(0).unwrap_or_default()),
            ));
        }
        text.parse::<f64>()
            .ok()
            .filter(|n| n.is_finite())
            .map(Token::Number)
            .ok_or_else(|| QueryError::syntax(start, "a number that fits a double"))
    }

    fn string(&mut self, quote: char, start: Position) -> Result<Token, QueryError> {
        self.bump();
        let mut s = String::new();
        loop {
            let at = self.position();
            match self.bump() {
                None => {
                    return Err(QueryError::syntax(
                        start,
                        &format!("a closing {quote} for the string started here"),
                    ));
                }
                Some(c) if c == quote => return Ok(Token::Str(s)),
                Some('\\') => {
                    let escaped = match self.bump() {
                        Some('\'') => '\'',
                        Some('"') => '"',
                        Some('\\') => '\\',
                        Some('/') => '/',
                        Some('b') => '\u{8}',
                        Some('f') => '\u{c}',
                        Some('n') => '\n',
                        Some('r') => '\r',
                        Some('t') => '\t',
                        Some('u') => self.unicode_escape(at)?,
                        _ => {
                            return Err(QueryError::syntax(
                                at,
                                "an escape: \\' \\\" \\\\ \\/ \\b \\f \\n \\r \\t or \\uXXXX",
                            ));
                        }
                    };
                    s.push(escaped);
                }
                Some(c) => s.push(c),
            }
        }
    }

    /// The `XXXX` of `\uXXXX`, joining a UTF-16 surrogate pair written as two escapes.
    fn unicode_escape(&mut self, at: Position) -> Result<char, QueryError> {
        let unit = self.hex4(at)?;
        if (0xD800..0xDC00).contains(&unit) && self.starts_with("\\u") {
            self.bump();
            self.bump();
            let low = self.hex4(at)?;
            if (0xDC00..0xE000).contains(&low) {
                let c = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                return char::from_u32(c)
                    .ok_or_else(|| QueryError::syntax(at, "a valid \\u escape"));
            }
        }
        char::from_u32(unit).ok_or_else(|| QueryError::syntax(at, "a valid \\u escape"))
    }

    fn hex4(&mut self, at: Position) -> Result<u32, QueryError> {
        let mut unit = 0;
        for _ in 0..4 {
            let digit = self
                .bump()
                .and_then(|c| c.to_digit(16))
                .ok_or_else(|| QueryError::syntax(at, "four hexadecimal digits after \\u"))?;
            unit = unit * 16 + digit;
        }
        Ok(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<Token> {
        tokenize(text)
            .expect("tokenizes")
            .into_iter()
            .map(|(t, _)| t)
            .collect()
    }

    #[test]
    fn tokens_and_positions() {
        let tokens = tokenize("SELECT c.a\n  FROM c WHERE c.x >>> 2 <> @p").expect("ok");
        assert_eq!(tokens[0].0, Token::Word("SELECT".into()));
        let from = tokens
            .iter()
            .find(|(t, _)| *t == Token::Word("FROM".into()));
        assert_eq!(from.map(|(_, p)| *p), Some(Position { line: 2, column: 3 }));
        assert!(tokens.iter().any(|(t, _)| *t == Token::Sym(">>>")));
        assert!(tokens.iter().any(|(t, _)| *t == Token::Sym("<>")));
        assert!(tokens.iter().any(|(t, _)| *t == Token::Param("p".into())));
    }

    #[test]
    fn numbers_and_strings() {
        assert_eq!(
            kinds("1 2.5 .5 1e3 0x1F 'it''s'"),
            vec![
                Token::Number(1.0),
                Token::Number(2.5),
                Token::Number(0.5),
                Token::Number(1000.0),
                Token::Number(31.0),
                Token::Str("it".into()),
                Token::Str("s".into()),
                Token::End
            ]
        );
        assert_eq!(
            kinds(r#""a\"b\n\u00e9\ud83d\ude00""#),
            vec![Token::Str("a\"b\né😀".into()), Token::End]
        );
    }

    #[test]
    fn errors_say_where() {
        let e = tokenize("SELECT 'open").expect_err("unterminated");
        assert!(e.to_string().contains("line 1, column 8"), "{e}");
        let e = tokenize("SELECT\n #").expect_err("stray");
        assert!(e.to_string().contains("line 2, column 2"), "{e}");
        assert!(tokenize("SELECT 12abc").is_err());
        assert!(tokenize("SELECT 1e999").is_err());
    }
}
