//! HTML: escaping, and the self-contained page (inline CSS, no scripts, no network) that
//! the report and the evaluation pages are written into.

/// Text safe in HTML content and in quoted attribute values alike.
pub fn esc(text: &str) -> String {
    let amp = text.replace('&', "&amp;");
    let tags = amp.replace('<', "&lt;").replace('>', "&gt;");
    tags.replace('"', "&quot;").replace('\'', "&#39;")
}

/// A whole page: `title` is escaped here, `style` is CSS and `body` HTML as they are.
pub fn document(title: &str, style: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + style.len() + 512);
    out.push_str("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str(&format!("<title>{}</title>\n<style>", esc(title)));
    out.push_str(style);
    out.push_str("</style>\n</head>\n<body>\n");
    out.push_str(body);
    out.push_str("</body>\n</html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_content_and_attributes() {
        assert_eq!(esc("<a b='x'>&\""), "&lt;a b=&#39;x&#39;&gt;&amp;&quot;");
        let page = document("a < b", "p{}", "<p>hi</p>\n");
        assert!(page.starts_with("<!doctype html>") && page.ends_with("</html>\n"));
        assert!(
            page.contains("<title>a &lt; b</title>") && page.contains("<body>\n<p>hi</p>\n</body>")
        );
    }
}
