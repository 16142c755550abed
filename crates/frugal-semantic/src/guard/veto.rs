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
    /// Not a guard's veto: the paraphrase verifier, within the error budget, did not accept
    /// the nearest candidate the vetoes let through.
    Verifier,
}

impl Veto {
    pub const ALL: [Veto; 13] = [
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
        Veto::Verifier,
    ];

    /// Whether the veto stands in front of the paraphrase verifier: what differs is a fact
    /// the answer turns on (a number, a unit, a name, a negation, a reversed relation, an
    /// opposite, another force of modal), never left to a model. The rest (a sibling word, a
    /// broader one, a degree word, content the embedder finds far) are where rewordings live,
    /// and the verifier, reading both questions together, decides them.
    pub fn is_hard(self) -> bool {
        !matches!(
            self,
            Veto::Cohyponym | Veto::Broader | Veto::Degree | Veto::Content
        )
    }

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
            Veto::Verifier => "verifier",
        }
    }
}
