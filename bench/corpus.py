"""The serving benchmark's corpus: distinct English-like sentences of 10 to 60 words.

Text is generated, not copied: a seeded :class:`random.Random` strings clauses
together from the word lists below (written for this benchmark). The same seed
always gives the same sentences, and a longer corpus starts with the shorter
one (``sentences(n)`` is a prefix of ``sentences(m)`` for ``n <= m``), so a run
that needs more text only appends. Every sentence is distinct.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator

SEED = 20260301
MIN_WORDS = 10
MAX_WORDS = 60

DETERMINERS = (
    "the", "a", "every", "each", "some", "one", "that", "this", "another", "no",
    "our", "their", "her", "his", "its", "any",
)  # fmt: skip

ADJECTIVES = (
    "quiet", "crooked", "patient", "amber", "hollow", "brisk", "tangled", "narrow",
    "silver", "muddy", "cheerful", "distant", "stubborn", "gentle", "rusty", "bright",
    "weary", "curious", "polished", "frozen", "noisy", "humble", "restless", "ancient",
    "careful", "damp", "fragile", "golden", "hasty", "idle", "jagged", "lonely",
    "modest", "nimble", "odd", "plain", "rapid", "sturdy", "tidy", "uneven",
    "vivid", "wooden", "young", "zealous", "faded", "spare", "borrowed", "salty",
    "woolen", "clumsy", "loyal", "sleepy", "velvet", "bitter", "smoky", "pale",
    "crowded", "empty", "heavy", "tiny", "broad", "steep", "shallow", "secret",
)  # fmt: skip

NOUNS = (
    "lantern", "orchard", "ferry", "teacher", "kettle", "harbour", "notebook", "river",
    "baker", "engine", "meadow", "bicycle", "window", "violin", "sparrow", "ledger",
    "carpenter", "tunnel", "garden", "compass", "island", "blanket", "tower", "farmer",
    "library", "pebble", "village", "wagon", "thunderstorm", "spreadsheet", "clerk",
    "staircase", "mirror", "candle", "market", "pilot", "valley", "chimney", "parcel",
    "committee", "printer", "glacier", "kitchen", "lighthouse", "postcard", "sailor",
    "workshop", "bridge", "cabinet", "puzzle", "recipe", "courtyard", "telescope",
    "shepherd", "museum", "bakery", "rooftop", "hallway", "station", "umbrella",
    "volunteer", "warehouse", "apron", "beacon", "canal", "doctor", "festival",
    "gardener", "helmet", "journal", "keyboard", "ladder", "musician", "neighbour",
    "oven", "painter", "quarry", "radio", "scientist", "tractor", "uniform", "vessel",
    "weaver", "yard", "zipper", "almanac", "barrel", "cottage", "drummer", "envelope",
    "fountain", "gravel", "hammock", "inventor", "jacket", "kitten", "lagoon",
    "mechanic", "nursery", "orchestra", "pantry", "quilt", "reservoir", "satchel",
    "thermos", "tram", "vineyard", "whistle", "server", "database", "router", "spider",
)  # fmt: skip

VERBS = (
    "carries", "paints", "repairs", "watches", "borrows", "follows", "measures",
    "polishes", "remembers", "questions", "gathers", "sketches", "delivers", "counts",
    "shelters", "ignores", "describes", "lifts", "tests", "warms", "sorts", "folds",
    "greets", "chases", "guards", "inspects", "labels", "mends", "notices", "opens",
    "praises", "rescues", "signals", "trades", "unlocks", "visits", "weighs", "wraps",
    "admires", "balances", "cleans", "decorates", "explores", "feeds", "hides",
    "invites", "juggles", "knocks", "loads", "moves", "names", "orders", "packs",
    "reaches", "scatters", "tows", "sends", "builds", "catches", "drops",
)  # fmt: skip

ADVERBS = (
    "slowly", "quietly", "eagerly", "twice", "again", "carefully", "suddenly",
    "gladly", "rarely", "yesterday", "tomorrow", "often", "barely", "almost",
    "loudly", "neatly", "early", "late", "gently", "proudly", "happily", "briefly",
)  # fmt: skip

PREPOSITIONS = (
    "near", "behind", "under", "beside", "across", "inside", "beyond", "above",
    "around", "toward", "without", "after", "before", "along", "between", "past",
)  # fmt: skip

CONJUNCTIONS = (
    "and", "but", "while", "because", "so", "although", "until", "whenever",
    "unless", "since", "yet", "after", "before", "as",
)  # fmt: skip

NUMBERS = (
    "two", "three", "four", "five", "seven", "nine", "eleven", "twelve", "twenty",
    "forty", "several", "many", "few", "dozen",
)  # fmt: skip


def _noun_phrase(rng: random.Random) -> list[str]:
    if rng.random() < 0.15:
        words = [rng.choice(NUMBERS)]
        if rng.random() < 0.5:
            words.append(rng.choice(ADJECTIVES))
        return [*words, rng.choice(NOUNS) + "s"]
    words = [rng.choice(DETERMINERS)]
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        words.append(rng.choice(ADJECTIVES))
    words.append(rng.choice(NOUNS))
    return words


def _clause(rng: random.Random) -> list[str]:
    words = _noun_phrase(rng)
    if rng.random() < 0.3:
        words.append(rng.choice(ADVERBS))
    words.append(rng.choice(VERBS))
    words += _noun_phrase(rng)
    if rng.random() < 0.6:
        words += [rng.choice(PREPOSITIONS), *_noun_phrase(rng)]
    if rng.random() < 0.3:
        words.append(rng.choice(ADVERBS))
    return words


def _sentence(rng: random.Random) -> str:
    length = rng.randint(MIN_WORDS, MAX_WORDS)
    words = _clause(rng)
    while len(words) < length:
        words.append(rng.choice(CONJUNCTIONS))
        words += _clause(rng)
    words = words[:length]
    if words[-1] in CONJUNCTIONS or words[-1] in DETERMINERS or words[-1] in PREPOSITIONS:
        words[-1] = rng.choice(NOUNS)
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def stream(seed: int = SEED) -> Iterator[str]:
    """The corpus for ``seed``, sentence after distinct sentence, without end."""
    rng = random.Random(seed)
    seen: set[str] = set()
    while True:
        text = _sentence(rng)
        if text not in seen:
            seen.add(text)
            yield text


def sentences(count: int, seed: int = SEED) -> list[str]:
    """The first ``count`` distinct sentences of the corpus for ``seed``."""
    return list(itertools.islice(stream(seed), count))


LONG_SEED = 20261130
"""The seed of the long-input corpus (:func:`long_texts`), apart from the short one's."""


def long_texts(
    count: int, tokens: Callable[[str], int], low: int = 100, high: int = 150
) -> list[str]:
    """``count`` distinct texts of ``low`` to ``high`` tokens each (``tokens`` counts them
    with the model's tokenizer, special tokens included): consecutive sentences of the
    :data:`LONG_SEED` corpus joined until a text reaches ``low`` tokens; a text that
    overshoots ``high`` is dropped and the next one starts afresh."""
    found: list[str] = []
    current: list[str] = []
    for sentence in stream(LONG_SEED):
        current.append(sentence)
        size = tokens(" ".join(current))
        if size < low:
            continue
        if size <= high:
            found.append(" ".join(current))
            if len(found) == count:
                return found
        current = []
    raise AssertionError("unreachable: the stream has no end")


class Corpus:
    """The corpus as a growing list: :meth:`take` hands out sentences never handed out before."""

    def __init__(self, seed: int = SEED) -> None:
        self.seed = seed
        self.texts: list[str] = []
        self._source = stream(seed)
        self.cursor = 0

    def ensure(self, count: int) -> None:
        """Generate until the list holds at least ``count`` sentences."""
        if count > len(self.texts):
            self.texts.extend(itertools.islice(self._source, count - len(self.texts)))

    def take(self, count: int) -> tuple[int, list[str]]:
        """The index of the first and the next ``count`` unused sentences."""
        first = self.cursor
        self.ensure(first + count)
        self.cursor += count
        return first, self.texts[first : self.cursor]


if __name__ == "__main__":
    for line in sentences(5):
        print(len(line.split()), line)
