"""The garden world's probabilistic grammar: documents of 2-4 sentences, then ``<eos>``.

The lecture (001 §0.3, §6.4) trains its small model pair on documents from a "garden world"
grammar and judges samples with that grammar's real checker. This module is the suite's own
garden world. Structure a model has to learn:

- agreement: subject and verb agree in person and number (``i am``, ``you are``, ``the owl
  sings``, ``the owls sing``, ``i was``, ``we were``), determiners agree with their noun
  (``this owl`` / ``these owls``), ``a`` / ``an`` follow the next word's initial sound, object
  pronouns are in the object case (``sees them``, never ``sees they``), ``there is`` / ``there
  are`` agree with the noun that follows;
- nesting: nouns take prepositional phrases (``the owl near the pond``) and relative clauses
  (subject relatives ``the owl that sings``, object relatives ``the owl that the crows follow``,
  where the inner verb agrees with the inner subject and the main verb with the outer noun), up
  to depth 2; verb phrases coordinate with ``and``;
- a long-range constraint: the document's topic (birds, insects, people or plants) is fixed by
  the first sentence's subject, and every noun of every later sentence is either a noun of that
  topic or a shared garden noun (subjects only topic nouns or pronouns); each topic also has its
  own intransitive verbs (birds ``sing``, plants ``bloom``).

The grammar is a feature-instantiated context-free grammar (:class:`Grammar`): every feature
(topic, agreement, depth, initial sound) is compiled into nonterminal names, so the generator
(:func:`sample_document`) and the checker (:mod:`inference_conformance.smallworld.checker`, a chart recognizer)
use the very same rule table. Depth is bounded, so there is no recursion without a bound and no
empty rule. Lexical choices use Zipf weights (1/rank) so frequent and rare words both occur.

Everything is deterministic from a seed (``random.Random(seed)``; no global state).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache

EOS = "<eos>"
PERIOD = "."
MAX_DEPTH = 2  # noun phrases at depth 2 take no modifiers

TOPICS = ("birds", "insects", "people", "plants")
AGREEMENTS = ("1sg", "2", "3sg", "pl")  # person/number classes that verbs distinguish
VOWEL_START = ("a", "e", "i", "o", "u")

# (singular, plural) per topic; vowel-initial nouns exercise a/an
TOPIC_NOUNS = {
    "birds": [("sparrow", "sparrows"), ("robin", "robins"), ("crow", "crows"), ("owl", "owls"),
              ("finch", "finches"), ("wren", "wrens"), ("swallow", "swallows"), ("magpie", "magpies"),
              ("heron", "herons"), ("eagle", "eagles")],
    "insects": [("bee", "bees"), ("ant", "ants"), ("beetle", "beetles"), ("moth", "moths"),
                ("butterfly", "butterflies"), ("wasp", "wasps"), ("ladybird", "ladybirds"),
                ("cricket", "crickets"), ("earwig", "earwigs"), ("caterpillar", "caterpillars")],
    "people": [("gardener", "gardeners"), ("child", "children"), ("farmer", "farmers"),
               ("neighbour", "neighbours"), ("girl", "girls"), ("boy", "boys"), ("woman", "women"),
               ("man", "men"), ("uncle", "uncles"), ("artist", "artists")],
    "plants": [("rose", "roses"), ("tulip", "tulips"), ("daisy", "daisies"), ("fern", "ferns"),
               ("oak", "oaks"), ("willow", "willows"), ("lily", "lilies"), ("poppy", "poppies"),
               ("orchid", "orchids"), ("iris", "irises")],
}
SHARED_NOUNS = [("garden", "gardens"), ("pond", "ponds"), ("path", "paths"), ("wall", "walls"),
                ("bench", "benches"), ("gate", "gates"), ("hedge", "hedges"), ("fence", "fences"),
                ("stone", "stones"), ("leaf", "leaves"), ("seed", "seeds"), ("apple", "apples"),
                ("acorn", "acorns"), ("umbrella", "umbrellas"), ("shed", "sheds")]
# (base, third person singular, past)
TOPIC_VERBS = {
    "birds": [("sing", "sings", "sang"), ("fly", "flies", "flew"), ("nest", "nests", "nested"),
              ("chirp", "chirps", "chirped"), ("soar", "soars", "soared")],
    "insects": [("buzz", "buzzes", "buzzed"), ("crawl", "crawls", "crawled"), ("hum", "hums", "hummed"),
                ("swarm", "swarms", "swarmed"), ("hide", "hides", "hid")],
    "people": [("work", "works", "worked"), ("laugh", "laughs", "laughed"), ("dig", "digs", "dug"),
               ("whistle", "whistles", "whistled"), ("sit", "sits", "sat")],
    "plants": [("grow", "grows", "grew"), ("bloom", "blooms", "bloomed"), ("wilt", "wilts", "wilted"),
               ("sway", "sways", "swayed"), ("climb", "climbs", "climbed")],
}
SHARED_INTRANSITIVE = [("wait", "waits", "waited"), ("rest", "rests", "rested"),
                       ("sleep", "sleeps", "slept"), ("move", "moves", "moved")]
TRANSITIVE = [("see", "sees", "saw"), ("like", "likes", "liked"), ("watch", "watches", "watched"),
              ("follow", "follows", "followed"), ("find", "finds", "found"), ("visit", "visits", "visited"),
              ("avoid", "avoids", "avoided"), ("know", "knows", "knew"), ("chase", "chases", "chased"),
              ("touch", "touches", "touched")]
ADJECTIVES = ["small", "old", "quiet", "green", "brown", "little", "busy", "happy", "tall", "young",
              "wild", "red", "orange", "eager", "idle", "ancient", "early", "empty", "elegant", "ugly"]
ADVERBS = ["quietly", "often", "again", "slowly", "today", "happily", "outside", "together"]
PREPOSITIONS = ["in", "near", "under", "behind", "beside", "on", "over", "by"]
DET_SG = ["this", "that", "every", "each", "one"]
DET_PL = ["these", "those", "many", "some", "two", "three", "few"]
DET_ANY = ["the", "my", "our", "their", "his", "her"]
SUBJECT_PRONOUNS = {"1sg": ["i"], "2": ["you"], "3sg": ["he", "she", "it"], "pl": ["we", "they"]}
OBJECT_PRONOUNS = ["me", "you", "him", "her", "it", "us", "them"]
BE_PRESENT = {"1sg": "am", "2": "are", "3sg": "is", "pl": "are"}
BE_PAST = {"1sg": "was", "2": "were", "3sg": "was", "pl": "were"}
RELATIVIZERS = ["that"]


def initial(word: str) -> str:
    """'V' for a word that takes ``an`` (vowel-initial), else 'C'."""
    return "V" if word[0] in VOWEL_START else "C"


def zipf(n: int) -> list[float]:
    return [1.0 / (r + 1) for r in range(n)]


@dataclass
class Grammar:
    """A weighted CFG: ``rules[A]`` is a list of (weight, rhs) with rhs a tuple of symbols.

    A symbol is a nonterminal when it is a key of ``rules``, else a terminal (a word).
    """

    start: str
    rules: dict[str, list[tuple[float, tuple[str, ...]]]] = field(default_factory=dict)

    def add(self, lhs: str, rhs, weight: float = 1.0) -> None:
        rhs = tuple(rhs)
        if not rhs:
            raise ValueError(f"empty rule for {lhs}: the garden grammar has no epsilon rules")
        self.rules.setdefault(lhs, []).append((float(weight), rhs))

    def words(self, lhs: str, words, weights=None) -> None:
        weights = zipf(len(words)) if weights is None else weights
        for w, word in zip(weights, words):
            self.add(lhs, (word,), w)

    def is_nonterminal(self, sym: str) -> bool:
        return sym in self.rules

    def terminals(self) -> set[str]:
        return {s for alts in self.rules.values() for _, rhs in alts for s in rhs if s not in self.rules}

    def reachable(self) -> set[str]:
        seen, stack = {self.start}, [self.start]
        while stack:
            for _, rhs in self.rules[stack.pop()]:
                for s in rhs:
                    if s in self.rules and s not in seen:
                        seen.add(s)
                        stack.append(s)
        return seen

    def prune(self) -> None:
        """Drop nonterminals the start symbol cannot reach (built by feature instantiation)."""
        keep = self.reachable()
        self.rules = {a: alts for a, alts in self.rules.items() if a in keep}

    def validate(self) -> None:
        """Raise ValueError for an unreachable or undefined nonterminal or left recursion."""
        seen = self.reachable()
        undefined = {s for alts in self.rules.values() for _, rhs in alts for s in rhs
                     if s[:1].isupper() and s not in self.rules}
        if undefined:
            raise ValueError(f"undefined nonterminals: {sorted(undefined)[:5]}")
        unused = set(self.rules) - seen
        if unused:
            raise ValueError(f"unreachable nonterminals: {sorted(unused)[:5]}")
        # left recursion: A =>+ A ... through leftmost symbols (no epsilon rules exist)
        left = {a: {rhs[0] for _, rhs in alts if rhs[0] in self.rules} for a, alts in self.rules.items()}
        state: dict[str, int] = {}

        def visit(a):
            state[a] = 1
            for b in left[a]:
                if state.get(b) == 1:
                    raise ValueError(f"left recursion through {a} -> {b}")
                if b not in state:
                    visit(b)
            state[a] = 2

        for a in self.rules:
            if a not in state:
                visit(a)


def _build() -> Grammar:
    g = Grammar(start="DOC")
    num_agr = {"sg": "3sg", "pl": "pl"}
    for t in TOPICS:
        g.add("DOC", (f"DOC_{t}",))
        # 2-4 sentences, then the end token
        g.add(f"DOC_{t}", (f"S1_{t}", f"S_{t}", EOS), 3)
        g.add(f"DOC_{t}", (f"S1_{t}", f"S_{t}", f"S_{t}", EOS), 4)
        g.add(f"DOC_{t}", (f"S1_{t}", f"S_{t}", f"S_{t}", f"S_{t}", EOS), 2)
        # the first sentence: a topic noun as subject (fixes the topic)
        for a in ("3sg", "pl"):
            g.add(f"S1_{t}", (f"CL_{t}_{a}_N", PERIOD), 1)
        # later sentences: topic noun or pronoun subject, or "there is/are"
        for a in AGREEMENTS:
            g.add(f"S_{t}", (f"CL_{t}_{a}_P", PERIOD), {"1sg": 0.5, "2": 0.3, "3sg": 0.6, "pl": 0.6}[a])
        for a in ("3sg", "pl"):
            g.add(f"S_{t}", (f"CL_{t}_{a}_N", PERIOD), 2.5)
        for n, a in num_agr.items():
            g.add(f"S_{t}", (f"THERE_{t}_{n}", PERIOD), 0.5)
            for be in ({"sg": "is", "pl": "are"}[n], {"sg": "was", "pl": "were"}[n]):
                g.add(f"THERE_{t}_{n}", ("there", be, f"NP_{t}_{n}_1_A"), 2)
                g.add(f"THERE_{t}_{n}", ("there", be, f"NP_{t}_{n}_1_A", f"PP_{t}_2"), 1)
        # clauses: subject (N = topic noun phrase, P = pronoun) + predicate
        for a in AGREEMENTS:
            g.words(f"PRON_{a}", SUBJECT_PRONOUNS[a], [1.0] * len(SUBJECT_PRONOUNS[a]))
            subjects = [("P", f"PRON_{a}")]
            if a in ("3sg", "pl"):
                n = "sg" if a == "3sg" else "pl"
                subjects.append(("N", f"NP_{t}_{n}_0_T"))
            for kind, subj in subjects:
                cl = f"CL_{t}_{a}_{kind}"
                g.add(cl, (subj, f"VP_{t}_{a}_1"), 5)
                g.add(cl, (subj, f"BE_{a}", f"PRED_{t}"), 2)
            g.add(f"BE_{a}", (BE_PRESENT[a],), 1)
            g.add(f"BE_{a}", (BE_PAST[a],), 1)
        g.add(f"PRED_{t}", ("ADJ",), 3)
        g.add(f"PRED_{t}", (f"PP_{t}_1",), 2)
        g.add(f"PRED_{t}", ("ADV_DEGREE", "ADJ"), 1)
        # verb phrases: VP_t_a_d, objects at depth d
        for a in AGREEMENTS:
            for d in (1, 2):
                vp1 = f"VP1_{t}_{a}_{d}"
                g.add(f"VP_{t}_{a}_{d}", (vp1,), 6 if d == 1 else 1)
                if d == 1:
                    g.add(f"VP_{t}_{a}_{d}", (vp1, "and", vp1), 1)
                g.add(vp1, (f"VI_{t}_{a}",), 3)
                g.add(vp1, (f"VI_{t}_{a}", "ADV"), 1.5)
                g.add(vp1, (f"VI_{t}_{a}", f"PP_{t}_{d}"), 1.5)
                g.add(vp1, (f"VT_{a}", f"OBJ_{t}_{d}"), 4)
                g.add(vp1, (f"VT_{a}", f"OBJ_{t}_{d}", "ADV"), 1)
            vi = [v for v in TOPIC_VERBS[t] + SHARED_INTRANSITIVE]
            form = 1 if a == "3sg" else 0
            g.words(f"VI_{t}_{a}", [v[form] for v in vi] + [v[2] for v in vi],
                    zipf(len(vi)) + [0.5 * w for w in zipf(len(vi))])
        # noun phrases: NP_t_n_d_c, c = T (topic nouns) or A (topic or shared nouns)
        for d in range(MAX_DEPTH + 1):
            g.add(f"OBJ_{t}_{d}", ("OPRON",), 1)
            for n in ("sg", "pl"):
                g.add(f"OBJ_{t}_{d}", (f"NP_{t}_{n}_{d}_A",), 4)
                for c in ("T", "A"):
                    np_, nom = f"NP_{t}_{n}_{d}_{c}", f"NOM_{t}_{n}_{d}_{c}"
                    for v in ("C", "V"):
                        g.add(np_, (f"DET_{n}", f"{nom}_{v}"), 3)
                        g.add(np_, ("the", f"{nom}_{v}"), 4)
                    if n == "sg":
                        g.add(np_, ("a", f"{nom}_C"), 2)
                        g.add(np_, ("an", f"{nom}_V"), 2)
                    else:
                        g.add(np_, (f"{nom}_C",), 0.7)
                        g.add(np_, (f"{nom}_V",), 0.7)
                    for v in ("C", "V"):
                        head_v = f"N_{t}_{n}_{c}_{v}"
                        head_any = f"N_{t}_{n}_{c}"
                        g.add(f"{nom}_{v}", (head_v,), 7)
                        g.add(f"{nom}_{v}", (f"ADJ_{v}", head_any), 3)
                        if d < MAX_DEPTH:
                            mods = f"MOD_{t}_{n}_{d + 1}"
                            w = 1.0 if d == 0 else 0.45
                            g.add(f"{nom}_{v}", (head_v, mods), w * 7 / 3)
                            g.add(f"{nom}_{v}", (f"ADJ_{v}", head_any, mods), w)
        for d in (1, 2):
            g.add(f"PP_{t}_{d}", ("PREP", f"OBJ_{t}_{d}"))
            for n in ("sg", "pl"):
                a = num_agr[n]
                g.add(f"MOD_{t}_{n}_{d}", (f"PP_{t}_{d}",), 1.2)
                g.add(f"MOD_{t}_{n}_{d}", ("that", f"VP_{t}_{a}_{d}"), 1)           # subject relative
                g.add(f"MOD_{t}_{n}_{d}", ("that", f"RSUBJ_{t}_{d}"), 0.8)          # object relative
            for a in AGREEMENTS:
                g.add(f"RSUBJ_{t}_{d}", (f"PRON_{a}", f"VT_{a}"), 0.3)
            for n in ("sg", "pl"):
                g.add(f"RSUBJ_{t}_{d}", (f"NP_{t}_{n}_{d}_T", f"VT_{num_agr[n]}"), 1)
        # nouns, by number, class and initial sound
        for n, k in (("sg", 0), ("pl", 1)):
            topic = [p[k] for p in TOPIC_NOUNS[t]]
            shared = [p[k] for p in SHARED_NOUNS]
            for c, words, weights in (("T", topic, zipf(len(topic))),
                                      ("A", topic + shared, zipf(len(topic)) + [0.6 * w for w in zipf(len(shared))])):
                g.words(f"N_{t}_{n}_{c}", words, weights)
                for v in ("C", "V"):
                    sel = [(w, x) for w, x in zip(weights, words) if initial(x) == v]
                    g.words(f"N_{t}_{n}_{c}_{v}", [x for _, x in sel], [w for w, _ in sel])
    for a in AGREEMENTS:
        form = 1 if a == "3sg" else 0
        g.words(f"VT_{a}", [v[form] for v in TRANSITIVE] + [v[2] for v in TRANSITIVE],
                zipf(len(TRANSITIVE)) + [0.5 * w for w in zipf(len(TRANSITIVE))])
    g.words("DET_sg", DET_SG + DET_ANY)
    g.words("DET_pl", DET_PL + DET_ANY)
    g.words("ADJ", ADJECTIVES)
    for v in ("C", "V"):
        g.words(f"ADJ_{v}", [x for x in ADJECTIVES if initial(x) == v])
    g.words("ADV", ADVERBS)
    g.words("ADV_DEGREE", ["very", "quite", "so"])
    g.words("PREP", PREPOSITIONS)
    g.words("OPRON", OBJECT_PRONOUNS, [1.0] * len(OBJECT_PRONOUNS))
    g.prune()
    g.validate()
    return g


@lru_cache(maxsize=1)
def grammar() -> Grammar:
    """The garden grammar (built once)."""
    return _build()


def vocabulary() -> list[str]:
    """Every word the grammar can produce, in a fixed order (sorted), ``<eos>`` included."""
    return sorted(grammar().terminals())


def topic_of(word: str) -> str | None:
    """The topic a noun belongs to (None for shared nouns and other words)."""
    for t, pairs in TOPIC_NOUNS.items():
        if any(word in p for p in pairs):
            return t
    return None


class _Sampler:
    def __init__(self, g: Grammar):
        self.g = g
        self.cum = {}
        for a, alts in g.rules.items():
            total, acc = sum(w for w, _ in alts), []
            s = 0.0
            for w, rhs in alts:
                s += w / total
                acc.append((s, rhs))
            self.cum[a] = acc

    def expand(self, sym: str, rng: random.Random, out: list[str]) -> None:
        if sym not in self.cum:
            out.append(sym)
            return
        u = rng.random()
        alts = self.cum[sym]
        rhs = alts[-1][1]
        for c, r in alts:
            if u < c:
                rhs = r
                break
        for s in rhs:
            self.expand(s, rng, out)


@lru_cache(maxsize=1)
def _sampler() -> _Sampler:
    return _Sampler(grammar())


def sample_document(rng: random.Random) -> list[str]:
    """One document (a list of words ending with ``<eos>``) drawn with ``rng``."""
    out: list[str] = []
    _sampler().expand(grammar().start, rng, out)
    return out


def generate_documents(n: int, seed: int) -> list[list[str]]:
    """``n`` documents, deterministic from ``seed`` (a private ``random.Random``)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    return [sample_document(rng) for _ in range(n)]
