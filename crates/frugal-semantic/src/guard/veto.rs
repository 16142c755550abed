//! The reasons a near neighbour is turned away.

/// Why a near neighbour was turned away. The names are `/metrics` label values
/// (`frugal_semantic_vetoes_total{reason}`) and the `x-frugal-semantic-veto` header's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Veto {
    /// A number, date, ordinal or version differs.
    Numbers,
    /// A unit or currency differs.
    Unit,
    /// An identifier, flag, call or operator differs.
    Code,
    /// A negation on one side only.
    Negation,
    /// A modal of another force (must / should / may) on one side.
    Modal,
    /// A quantity or intensity word differs.
    Degree,
    /// A word replaced by its opposite.
    Antonym,
    /// A word replaced by a sibling of the same category (Paris / Rome).
    Cohyponym,
    /// A word replaced by a broader or narrower one (laptop / computer).
    Broader,
    /// A name replaced by another (or one on one side only).
    Entity,
    /// Content words replaced by others the embedder does not find close.
    Content,
    /// The same content words in another order around a relation.
    Swapped,
}

impl Veto {
    pub const ALL: [Veto; 12] = [
        Veto::Numbers,
        Veto::Unit,
        Veto::Code,
        Veto::Negation,
        Veto::Modal,
        Veto::Degree,
        Veto::Antonym,
        Veto::Cohyponym,
        Veto::Broader,
        Veto::Entity,
        Veto::Content,
        Veto::Swapped,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Veto::Numbers => "numbers",
            Veto::Unit => "unit",
            Veto::Code => "code",
            Veto::Negation => "negation",
            Veto::Modal => "modal",
            Veto::Degree => "degree",
            Veto::Antonym => "antonym",
            Veto::Cohyponym => "cohyponym",
            Veto::Broader => "broader",
            Veto::Entity => "entity",
            Veto::Content => "content",
            Veto::Swapped => "swapped",
        }
    }
}
