//! Language codes for `translategemma_template`: BCP 47-style codes resolved against a table
//! of ISO 639-1 codes and English names.

use super::PromptError;

/// A resolved language: its normalized code and English name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Language {
    /// The code as the prompt writes it: base language in lower case, then any subtags
    /// (`pt-BR`, `zh-Hant`, `sr-Latn-RS`), `_` turned into `-`.
    pub code: String,
    /// The English name of the base language.
    pub name: &'static str,
}

/// ISO 639-1 codes (plus `fil`) and their English names: the 55 languages of TranslateGemma's
/// WMT24++ evaluation and the other widely used ones. Sorted by code.
pub const LANGUAGES: &[(&str, &str)] = &[
    ("af", "Afrikaans"),
    ("am", "Amharic"),
    ("ar", "Arabic"),
    ("az", "Azerbaijani"),
    ("be", "Belarusian"),
    ("bg", "Bulgarian"),
    ("bn", "Bengali"),
    ("bs", "Bosnian"),
    ("ca", "Catalan"),
    ("cs", "Czech"),
    ("cy", "Welsh"),
    ("da", "Danish"),
    ("de", "German"),
    ("el", "Greek"),
    ("en", "English"),
    ("eo", "Esperanto"),
    ("es", "Spanish"),
    ("et", "Estonian"),
    ("eu", "Basque"),
    ("fa", "Persian"),
    ("fi", "Finnish"),
    ("fil", "Filipino"),
    ("fr", "French"),
    ("ga", "Irish"),
    ("gl", "Galician"),
    ("gu", "Gujarati"),
    ("ha", "Hausa"),
    ("he", "Hebrew"),
    ("hi", "Hindi"),
    ("hr", "Croatian"),
    ("ht", "Haitian Creole"),
    ("hu", "Hungarian"),
    ("hy", "Armenian"),
    ("id", "Indonesian"),
    ("ig", "Igbo"),
    ("is", "Icelandic"),
    ("it", "Italian"),
    ("ja", "Japanese"),
    ("jv", "Javanese"),
    ("ka", "Georgian"),
    ("kk", "Kazakh"),
    ("km", "Khmer"),
    ("kn", "Kannada"),
    ("ko", "Korean"),
    ("ku", "Kurdish"),
    ("ky", "Kyrgyz"),
    ("la", "Latin"),
    ("lb", "Luxembourgish"),
    ("lo", "Lao"),
    ("lt", "Lithuanian"),
    ("lv", "Latvian"),
    ("mg", "Malagasy"),
    ("mi", "Maori"),
    ("mk", "Macedonian"),
    ("ml", "Malayalam"),
    ("mn", "Mongolian"),
    ("mr", "Marathi"),
    ("ms", "Malay"),
    ("mt", "Maltese"),
    ("my", "Burmese"),
    ("nb", "Norwegian Bokmål"),
    ("ne", "Nepali"),
    ("nl", "Dutch"),
    ("nn", "Norwegian Nynorsk"),
    ("no", "Norwegian"),
    ("pa", "Punjabi"),
    ("pl", "Polish"),
    ("ps", "Pashto"),
    ("pt", "Portuguese"),
    ("ro", "Romanian"),
    ("ru", "Russian"),
    ("rw", "Kinyarwanda"),
    ("sd", "Sindhi"),
    ("si", "Sinhala"),
    ("sk", "Slovak"),
    ("sl", "Slovenian"),
    ("so", "Somali"),
    ("sq", "Albanian"),
    ("sr", "Serbian"),
    ("sv", "Swedish"),
    ("sw", "Swahili"),
    ("ta", "Tamil"),
    ("te", "Telugu"),
    ("tg", "Tajik"),
    ("th", "Thai"),
    ("tl", "Tagalog"),
    ("tr", "Turkish"),
    ("uk", "Ukrainian"),
    ("ur", "Urdu"),
    ("uz", "Uzbek"),
    ("vi", "Vietnamese"),
    ("xh", "Xhosa"),
    ("yi", "Yiddish"),
    ("yo", "Yoruba"),
    ("zh", "Chinese"),
    ("zu", "Zulu"),
];

/// The English name of a base language code (`"pt"` → `"Portuguese"`), case-insensitive.
pub fn language_name(base: &str) -> Option<&'static str> {
    LANGUAGES.iter().find(|(code, _)| code.eq_ignore_ascii_case(base)).map(|(_, name)| *name)
}

/// Resolves a BCP 47-style code (`de`, `pt-BR`, `pt_br`, `zh-Hant-TW`): the base language must
/// be in [`LANGUAGES`]; subtags must be 1–8 ASCII letters or digits. Regions are written in
/// upper case, scripts in title case; the name is the base language's.
pub fn language(code: &str) -> Result<Language, PromptError> {
    let unknown = || PromptError::UnknownLanguageCode(code.to_owned());
    let mut parts = code.trim().split(['-', '_']);
    let base = parts.next().unwrap_or("");
    let name = language_name(base).ok_or_else(unknown)?;
    let mut normalized = base.to_ascii_lowercase();
    for part in parts {
        if part.is_empty() || part.len() > 8 || !part.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(unknown());
        }
        normalized.push('-');
        match part.len() {
            2 if part.bytes().all(|b| b.is_ascii_alphabetic()) => {
                normalized.push_str(&part.to_ascii_uppercase());
            }
            4 if part.bytes().all(|b| b.is_ascii_alphabetic()) => {
                normalized.push_str(&part[..1].to_ascii_uppercase());
                normalized.push_str(&part[1..].to_ascii_lowercase());
            }
            _ => normalized.push_str(&part.to_ascii_lowercase()),
        }
    }
    Ok(Language { code: normalized, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn language_codes_normalize() {
        assert_eq!(
            language("pt_br").unwrap(),
            Language { code: "pt-BR".into(), name: "Portuguese" }
        );
        assert_eq!(language("ZH-hant").unwrap().code, "zh-Hant");
        assert!(language("auto").is_err());
        assert!(language("en-").is_err());
        assert!(LANGUAGES.windows(2).all(|w| w[0].0 < w[1].0), "sorted, no duplicates");
    }
}
