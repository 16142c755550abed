#![allow(clippy::unwrap_used)]

use super::*;

fn v(a: &str, b: &str) -> Option<Veto> {
    veto(a, b, None)
}

#[test]
fn vetoes_name_what_differs() {
    let cases = [
        (
            "How do I lose 10 pounds in a month?",
            "How do I lose 20 pounds in a month?",
            Veto::Numbers,
        ),
        (
            "What caused the First Congo War?",
            "What caused the Second Congo War?",
            Veto::Numbers,
        ),
        (
            "Can I run five miles a day?",
            "Can I run 6 miles a day?",
            Veto::Numbers,
        ),
        (
            "Is it safe to eat raw eggs?",
            "Is it not safe to eat raw eggs?",
            Veto::Negation,
        ),
        (
            "Why can't I sleep at night?",
            "Why can I sleep at night?",
            Veto::Negation,
        ),
        (
            "Must I declare cash at customs?",
            "May I declare cash at customs?",
            Veto::Modal,
        ),
        ("How far is 5 km?", "How far is 5 miles?", Veto::Unit),
        (
            "What is 30 in Celsius?",
            "What is 30 in Fahrenheit?",
            Veto::Unit,
        ),
        (
            "When should I use list.append?",
            "When should I use list.extend?",
            Veto::Code,
        ),
        (
            "What does git reset --soft do?",
            "What does git reset --hard do?",
            Veto::Code,
        ),
        (
            "Why is my headache mild?",
            "Why is my headache severe?",
            Veto::Degree,
        ),
        ("Do all cats purr?", "Do some cats purr?", Veto::Degree),
        (
            "How do I gain weight fast?",
            "How do I lose weight fast?",
            Veto::Antonym,
        ),
        (
            "How do I increase my heart rate?",
            "How do I decrease my heart rate?",
            Veto::Antonym,
        ),
        (
            "What is the capital of France?",
            "What is the capital of Italy?",
            Veto::Cohyponym,
        ),
        (
            "Who is the CEO of Zyntara?",
            "Who is the CEO of Korvex?",
            Veto::Entity,
        ),
        (
            "How can I convert dollars to rupees?",
            "How can I convert rupees to dollars?",
            Veto::Swapped,
        ),
        (
            "Is Python faster than Java?",
            "Is Java faster than Python?",
            Veto::Swapped,
        ),
        (
            "Does the kernel depend on glibc?",
            "Does glibc depend on the kernel?",
            Veto::Swapped,
        ),
        (
            "Can a dog catch rabies from a bat?",
            "Can a bat catch rabies from a dog?",
            Veto::Swapped,
        ),
    ];
    for (a, b, want) in cases {
        assert_eq!(v(a, b), Some(want), "{a} / {b}");
        assert_eq!(
            Guard::default().judge(a, b, 0.999, None),
            Verdict::Veto(want),
            "{a} / {b}"
        );
    }
}

#[test]
fn rewordings_pass() {
    for (a, b) in [
        (
            "How can I improve my English?",
            "How do I improve my English?",
        ),
        ("Which laptop should I buy?", "Which laptop I should buy?"),
        (
            "What's the boiling point of water?",
            "What is the boiling point of water?",
        ),
        ("Why don't cats like water?", "Why do cats not like water?"),
        (
            "How do I go from Delhi to Mumbai?",
            "How do I go to Mumbai from Delhi?",
        ),
        (
            "What is better, Java or Python?",
            "Which is better: Python or Java?",
        ),
        (
            "Could you tell me how to purchase a car?",
            "How do I buy a car?",
        ),
        ("Can I run five miles a day?", "Can I run 5 miles a day?"),
        (
            "Is 50% of 10 km far?",
            "Is 50 percent of 10 kilometres far?",
        ),
        (
            "What is France's population?",
            "What is the population of France?",
        ),
    ] {
        assert_eq!(v(a, b), None, "{a} / {b}");
    }
}

#[test]
fn threshold_applies_first_and_vetoes_can_be_off() {
    let g = Guard::default();
    assert_eq!(g.judge("x", "x", g.threshold - 0.01, None), Verdict::TooFar);
    assert_eq!(g.judge("x", "x", g.threshold, None), Verdict::Same);
    let plain = Guard { vetoes: false, ..g };
    assert_eq!(plain.judge("Buy 1", "Buy 2", 0.99, None), Verdict::Same);
}

#[test]
fn the_embedder_judges_spans_wordnet_cannot_relate() {
    let e = crate::embed::tests::embedder();
    // WordNet puts "choose" above "pick"; the embedder finds them close.
    let (a, b) = (
        "How do I pick a good mattress?",
        "How do I choose a good mattress?",
    );
    let x = explain(a, b, Some(e));
    assert!(
        x.span_similarity.is_some_and(|s| s >= compare::SPAN_MIN),
        "{x:?}"
    );
    assert_eq!(x.veto, None, "{x:?}");
    // Without the embedder such a replacement is refused.
    assert_eq!(explain(a, b, None).veto, Some(Veto::Broader));
    // Far apart in meaning: refused with it too.
    let far = explain(
        "At what temperature does gold melt?",
        "What's the melting point of gold?",
        Some(e),
    );
    assert_eq!(far.veto, Some(Veto::Content), "{far:?}");
}

#[test]
fn roles_and_spellings() {
    for (a, b, want) in [
        (
            "Is a wolf a type of dog?",
            "Is a dog a type of wolf?",
            Veto::Swapped,
        ),
        ("Is a wolf a dog?", "Is a dog a wolf?", Veto::Swapped),
        (
            "How many steps are in one mile?",
            "How many steps are in two miles?",
            Veto::Numbers,
        ),
    ] {
        assert_eq!(v(a, b), Some(want), "{a} / {b}");
    }
    for (a, b) in [
        (
            "How many steps are in 1 mile?",
            "How many steps are in one mile?",
        ),
        ("Which one is cheaper?", "Which is cheaper?"),
        (
            "My phone will not connect to WiFi",
            "My phone won't connect to Wi-Fi",
        ),
        (
            "How do I cool a room without AC?",
            "How do I cool a room without air conditioning?",
        ),
        (
            "Is quinoa or brown rice healthier?",
            "Is brown rice or quinoa healthier?",
        ),
        (
            "How do I do a last name change?",
            "How do I change my last name?",
        ),
        (
            "For a sore throat, what tea is best?",
            "What tea is best for a sore throat?",
        ),
    ] {
        assert_eq!(v(a, b), None, "{a} / {b}");
    }
}

#[test]
fn numbers_and_identifiers_keep_their_order() {
    assert_eq!(
        v("Is 7 greater than 5?", "Is 5 greater than 7?"),
        Some(Veto::Swapped)
    );
    assert_eq!(
        v(
            "How do I cast int64_t to int32_t?",
            "How do I cast int32_t to int64_t?"
        ),
        Some(Veto::Swapped)
    );
    assert_eq!(
        v("Is 7 greater than 5?", "Is seven greater than five?"),
        None
    );
}

#[test]
fn odd_text_reads_without_panicking() {
    let odd = [
        "",
        "   ",
        "?!",
        "°C°F°",
        "’’’ don’t’",
        "1,2,3,,4..5",
        "2-",
        "-2-year--old-",
        "3rd4th 10km/h $$$ 5%%",
        "😀 emoji 😀 and 日本語の質問は何ですか",
        "مرحبا كيف حالك",
        "e\u{301}te\u{301} cafe\u{301}",
        "`` `a` `",
        "a.b.c. .d ::x:: --",
        "one one one of one",
        "twenty twenty twenty hundred thousand million billion",
    ];
    let e = crate::embed::tests::embedder();
    for a in odd {
        // A text is the same question as itself.
        assert_eq!(explain(a, a, None).veto, None, "{a:?} against itself");
        for b in odd {
            std::hint::black_box(explain(a, b, Some(e)));
        }
    }
}
