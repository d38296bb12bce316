"""Small, generated, clearly-labelled DEMO data for the built-in default models.

Three generators, each a small grammar over word lists, so that the demo heads meet the
shapes ordinary English has and not one sentence frame repeated:

- sentiment: clauses with intensifiers and negation ("not bad", "never boring" are positive),
  joined by contrast ("..., but ...", "although ...", "... However, ...": the main clause
  decides, so mixed reviews get the label of what the writer concludes), verdicts, ratings;
- NER (PER / LOC / ORG / MISC, IOB2): multi-word places, organisations with Inc. / AG / Ltd,
  "University of ...", "Central Bank of ...", people with titles (not tagged, as in CoNLL-2003)
  and middle names, nationalities and events; sentences without any entity, and capitalised
  days and months that are not entities;
- QA: paragraphs of four to seven sentences about a building, a person, a company or an event,
  asked who / what / when / where / which year / how many / how much / how long, with answers
  that are names, dates, numbers, sums of money and durations, and distractors of the same
  type in the same paragraph (two dates, two sums, two numbers).

Enough to turn all-MiniLM-L6-v2 into demo heads in a few minutes on a laptop CPU; not a
benchmark and not a substitute for real data (fine-tune on SST-2, CoNLL-2003 or SQuAD for that:
see docs/training.md). The hand-written check set the build scores them on is `demo.checks`;
nothing of it is in these lists.

    python -m demo.data --out runs/demo-data     # the three training files

Formats are the ones `training.finetune` reads: classification and token-classification JSONL,
question answering as SQuAD v1.1 JSON.
"""

from __future__ import annotations

import json
import random
import re
import string
from dataclasses import dataclass
from pathlib import Path

from demo.qa_data import qa_examples  # the QA grammar, long enough for its own module
from training.cli import option, parse


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split("|")]


# --- sentiment --------------------------------------------------------------------------------

ASPECTS = _words(
    "the food|the staff|the waiters|the room|the plot|the acting|the music|the ending|the price|"
    "the screen|the delivery|the hotel|the film|the book|the game|the coffee|the seats|the view|"
    "the design|the sound|the manual|the location|the show|the dessert|the checkout|the driver|"
    "the course|the teacher|the headphones|the camera|the pizza|the trip|the apartment|the gym|"
    "the script|the soundtrack|the interface|the flight|the cast|the tour|the update"
)
GOOD = _words(
    "good|great|wonderful|excellent|fantastic|lovely|brilliant|superb|delicious|friendly|perfect|"
    "amazing|pleasant|enjoyable|impressive|charming|fun|beautiful|comfortable|helpful|outstanding|"
    "solid|decent|gorgeous|spotless|reliable|tasty|funny|clever|smooth|fast|generous|stunning"
)
BAD = _words(
    "bad|terrible|awful|horrible|boring|dull|disappointing|poor|rude|slow|dirty|bland|noisy|"
    "overpriced|broken|useless|mediocre|weak|annoying|uncomfortable|confusing|tasteless|sloppy|"
    "unbearable|tedious|clumsy|greasy|forgettable|cramped|buggy|lazy|miserable|shabby"
)
STRONG = _words("very|really|truly|absolutely|incredibly|extremely|so|remarkably|totally|utterly")
MILD = _words("quite|rather|pretty|fairly|a little|a bit|somewhat")
# Each flips the polarity of the adjective after it: "not bad" is positive.
NEGATORS = _words("not|never|not at all|hardly|far from|not particularly|not very|by no means")
LIKE = _words("loved|enjoyed|liked|adored|appreciated|was impressed by|was delighted with")
DISLIKE = _words("hated|disliked|regretted|could not stand|was fed up with|was let down by")
LIKE_BASE = _words("enjoy|like|love|appreciate")  # negated: "did not enjoy"
GOOD_NOUN = _words("a joy|a real treat|a gem|a pleasure|a delight|a triumph|worth every penny")
BAD_NOUN = _words("a waste of time|a disaster|a letdown|a rip-off|a mess|a nightmare|a chore")
WHO = _words("I|we|my wife|my husband|our kids|my parents|everyone|my friends|the whole family")
PRAISE = _words(
    "would go again|will be back|highly recommended|can't wait to return|would buy it again|"
    "money well spent|ten out of ten|recommended without hesitation"
)
PAN = _words(
    "never again|avoid|would not recommend it|save your money|one star is too many|"
    "I want a refund|stay away|not coming back"
)
# Set phrases whose negation does not flip them: "could not be happier" is praise.
GOOD_IDIOMS = _words(
    "could not be happier|could not have asked for more|I have never been so impressed|"
    "I have never laughed so much|nothing to complain about|no complaints at all|"
    "worth every minute|better than I hoped|exceeded every expectation|can't praise it enough"
)
BAD_IDIOMS = _words(
    "nothing special|nothing to write home about|I have never been so disappointed|"
    "I have never been so annoyed|could have been much better|could not have been worse|"
    "not worth it|not worth the wait|far too expensive|way too loud|far too salty|way too long|"
    "a complete waste|not what I paid for"
)
BE = {"the": ["was", "is"], "plural": ["were", "are"]}


def _adjective(positive: bool, rng: random.Random) -> str:
    """An adjective phrase of the given polarity: plain, graded, or a negated opposite."""
    kind = rng.random()
    if kind < 0.3:  # "not bad", "never boring", "far from perfect"
        return f"{rng.choice(NEGATORS)} {rng.choice(BAD if positive else GOOD)}"
    word = rng.choice(GOOD if positive else BAD)
    if kind < 0.6:
        return f"{rng.choice(STRONG)} {word}"
    if kind < 0.7:
        return f"{rng.choice(MILD)} {word}"
    return word


def _clause(positive: bool, rng: random.Random) -> str:
    """One clause whose polarity is `positive`, with no final punctuation."""
    aspect = rng.choice(ASPECTS)
    be = rng.choice(BE["plural" if aspect.endswith("s") else "the"])
    kind = rng.randrange(7)
    if kind == 6:
        return rng.choice(GOOD_IDIOMS if positive else BAD_IDIOMS)
    if kind <= 1:
        return f"{aspect} {be} {_adjective(positive, rng)}"
    if kind == 2:
        return f"{rng.choice(WHO)} {rng.choice(LIKE if positive else DISLIKE)} {aspect}"
    if kind == 3:
        if positive:  # "I did not enjoy it" is negative; its positive twin is plain
            return f"{rng.choice(WHO)} {rng.choice(LIKE)} it"
        return f"{rng.choice(WHO)} did not {rng.choice(LIKE_BASE)} {aspect}"
    if kind == 4:
        return f"{aspect} {be} {rng.choice(GOOD_NOUN if positive else BAD_NOUN)}"
    return f"{rng.choice(STRONG + ['', ''])} {rng.choice(GOOD if positive else BAD)} {aspect.split()[-1]}".strip()


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def sentiment_sentence(positive: bool, rng: random.Random) -> str:
    """A review sentence whose final verdict is `positive`."""
    end = rng.choice([".", ".", ".", "!", "..."])
    main, other = _clause(positive, rng), _clause(not positive, rng)
    shape = rng.randrange(10)
    if shape == 0:
        return _cap(main) + end
    if shape == 1:  # a fragment: "Not bad at all", "Absolutely stunning"
        adj = _adjective(positive, rng)
        if adj.startswith("not ") and "at all" not in adj and rng.random() < 0.3:
            adj += " at all"
        return _cap(adj) + end
    if shape == 2:  # the contrast decides
        return f"{_cap(other)}, but {main}{end}"
    if shape == 3:
        return f"{_cap(rng.choice(['although', 'even though', 'while']))} {other}, {main}{end}"
    if shape == 4:
        return f"{_cap(main)}, {rng.choice(['although', 'even though', 'though'])} {other}{end}"
    if shape == 5:
        return f"{_cap(other)}. {rng.choice(['However', 'Still', 'Then again'])}, {main}{end}"
    if shape == 6:  # the same polarity throughout
        return f"{_cap(main)} and {_clause(positive, rng)}{end}"
    if shape == 7:
        verdict = rng.choice(PRAISE if positive else PAN)
        return f"{_cap(main)}. {_cap(verdict)}{end}"
    if shape == 8:
        stars = rng.choice([4, 5] if positive else [1, 2])
        word = ["", "One star", "Two stars", "", "Four stars", "Five stars"][stars]
        return f"{word}: {main}{end}" if rng.random() < 0.5 else f"{_cap(main)}. {word}{end}"
    return f"{_cap(other)}, {rng.choice(['yet', 'but still', 'but overall'])} {main}{end}"


def sentiment_examples(n: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        text = re.sub(r"\s+", " ", sentiment_sentence(positive, rng))
        rows.append({"text": text, "label": "positive" if positive else "negative"})
    return rows


# --- named entities ---------------------------------------------------------------------------

FIRST = _words(
    "Amara|Tomasz|Ingrid|Rafael|Mei|Olusegun|Sven|Priya|Diego|Hannah|Yusuf|Chiara|Mateo|Aiko|"
    "Leila|Bogdan|Rosa|Nikolai|Fatou|Henrik|Camille|Arjun|Zeynep|Pablo|Greta|Kwame|Elif|Jonas|"
    "Marta|Tariq|Sophie|Dmitri|Lucia|Oren|Beatriz|Nadia|Wei|Lars|Thandiwe|Malik|Ines|Connor|"
    "Svetlana|Emeka|Astrid|Joaquin|Keiko|Rohan|Agnes|Felix"
)
MIDDLE = _words("Louise|Maria|Jean|Paul|Ann|Lee|Rose|Elizabeth|Thomas|Luis|Marie|Kofi|Anne|Jose")
LAST = _words(
    "Okonkwo|Lindqvist|Ferreira|Nakamura|Kowalczyk|Haddad|Moreau|van der Berg|de la Cruz|"
    "O'Brien|Petrov|Gonzalez|Mbeki|Schneider|Rossi|Andersen|Kaya|Novak|Silva|Dubois|Osei|"
    "Horvath|Castillo|Nguyen|Brennan|Fischer|Ivanova|Rahman|Kiplagat|McAllister|Bianchi|Park|"
    "Abdullah|Lefebvre|Sato|Mwangi|Jensen|Herrera|Kim-Larsen|Duarte"
)
TITLES = _words(
    "Dr.|Mr.|Mrs.|Ms.|Professor|President|Senator|Judge|Minister|Captain|Chef|Coach|Dame|"
    "General|Mayor|Prince|Inspector|Father|Lady|Ambassador"
)
PLACES = _words(
    "Lyon|Krakow|Seville|Tampere|Gdansk|Porto|Valencia|Bergen|Leipzig|Turin|Nagoya|Busan|Lagos|"
    "Kampala|Quito|Lima|Santiago|Manila|Hanoi|Perth|Adelaide|Halifax|Calgary|Denver|Austin|"
    "Glasgow|Cork|Antwerp|Graz|Bordeaux|Marseille|Casablanca|Tunis|Izmir|Tbilisi|Almaty|Chennai|"
    "Kolkata|Dhaka|Portugal|Norway|Peru|Chile|Vietnam|Ghana|Kenya|Poland|Turkey|Egypt|Argentina|"
    "India|Japan|Ireland|Greece|Finland|Morocco|Indonesia|Australia|Germany|Texas|Bavaria|"
    "Scotland|Ontario|Tuscany|Asia|Europe|South Dakota|West Virginia|North Macedonia|South Korea|"
    "East Timor|Western Australia|Northern Ireland|Lower Saxony|New Mexico|New Jersey|"
    "New Zealand|New Delhi|New Orleans|San Diego|San Sebastian|Santa Fe|Saint Petersburg|"
    "Buenos Aires|Cape Town|Hong Kong|Kuala Lumpur|Sri Lanka|Costa Rica|Puerto Rico|El Salvador|"
    "Las Vegas|Tel Aviv|Abu Dhabi|Addis Ababa|Ho Chi Minh City|Quebec City|Panama City|"
    "Kansas City|Salt Lake City|Lake Geneva|Lake Victoria|Lake Como|Mount Fuji|Mount Etna|"
    "Port Elizabeth|Dar es Salaam|Sierra Leone|Baden-Baden|Rocky Mountains|Black Forest|Sahara"
)
PLACE_STEMS = _words(
    "Kirra|Malvern|Tavira|Orsk|Elmira|Wexford|Dunmore|Corran|Alder|Sedona|Tamar|Loreto|Vianden|"
    "Harlow|Bexley|Carrow|Istra|Kaval|Morvan|Pella|Rowan|Salcombe|Tovar|Ulva|Varna|Wilder|Zamora"
)
PLACE_SHAPES = _words(
    "North {}|South {}|East {}|West {}|New {}|Upper {}|Lower {}|Port {}|Lake {}|Mount {}|San {}|"
    "Santa {}|Saint {}|Cape {}|{} City|{} Island|{} Bay|{} Valley|{} Heights|{} Springs|"
    "Fort {}|{} Beach|{} del Mar|{} de la Sierra"
)
COMPANY_STEMS = _words(
    "Brightwater|Nordvik|Halden|Kestrel|Meridian|Orion|Alpina|Crescent|Bluepeak|Tessaro|Falkner|"
    "Zenith|Redwood|Lumen|Solis|Vantage|Ironbridge|Helix|Corvus|Aurora|Granite|Silverline|"
    "Pinecrest|Oakmont|Vela|Kronos|Atlas|Marlow"
)
COMPANY_KINDS = _words(
    "|Systems|Motors|Airlines|Energy|Pharmaceuticals|Technologies|Foods|Insurance|Logistics|"
    "Media|Robotics|Capital|Steel|Telecom|Software|Chemicals|Shipping|Studios"
)
COMPANY_ENDS = _words("Inc.|AG|GmbH|Ltd|Ltd.|Corp.|Group|Holdings|SA|plc|LLC|Co.")
ORGS = _words(
    "Nestle|Ericsson|Philips|Heineken|Lufthansa|Renault|Unilever|Airbus|Nokia|Adidas|Bosch|"
    "Carrefour|Ikea|Spotify|Netflix|Intel|Oracle|Honda|Hyundai|Tata Motors|Petrobras|Alibaba|"
    "Reuters|UNESCO|NATO|Interpol|Greenpeace|FIFA|World Bank|International Monetary Fund|"
    "African Union|European Union|World Trade Organization|Asian Development Bank|"
    "Ministry of Health|Ministry of Finance|Ministry of Defence|Supreme Court|Federal Reserve|"
    "Amnesty International|Doctors Without Borders|Bank of Japan|Bundesbank|IBM|UNICEF|OPEC|"
    "NASA|CERN|BMW|HSBC|ESA|KLM|Interpol"
)
NATIONAL_ORGS = _words(
    "Red Crescent|Football Association|Space Agency|Navy|Parliament|Academy of Sciences|"
    "Medical Association|Olympic Committee|Broadcasting Corporation|Rail|Post"
)
NATIONALITIES = _words(
    "Portuguese|Norwegian|Peruvian|Chilean|Vietnamese|Ghanaian|Kenyan|Polish|Turkish|Egyptian|"
    "Argentine|Indian|Japanese|Irish|Greek|Finnish|Moroccan|Korean|Dutch|Austrian|Mexican|"
    "Nigerian|Australian|Scottish|Belgian|Danish|Hungarian|Thai|Colombian|Ukrainian"
)
LANGUAGES = _words("Spanish|Arabic|Mandarin|Swahili|Hindi|Russian|English|Portuguese|Tagalog")
EVENTS = _words(
    "Winter Olympics|Commonwealth Games|Champions League|Eurovision Song Contest|Venice Biennale|"
    "Cannes Film Festival|Boston Marathon|Super Bowl|Giro d'Italia|Davis Cup|Ryder Cup|"
    "Paralympic Games|Asian Games|Gold Cup|Frankfurt Book Fair|Oscars|Nobel Prize|"
    "Booker Prize|Chinese New Year|Ramadan|Carnival"
)
SCHOOL_KINDS = _words(
    "University of {}|{} University|{} Institute of Technology|{} School of Music"
)
DAYS = _words("Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday")
MONTHS = _words(
    "January|February|March|April|May|June|July|August|September|October|November|December"
)
JOBS = _words("engineer|writer|doctor|lawyer|nurse|pilot|architect|farmer|singer|diplomat|teacher")


def person(rng: random.Random, titled: float = 0.3) -> list[tuple[str, str | None]]:
    """A name as (text, tag) pieces: an optional title outside the entity, then the name."""
    first, last = rng.choice(FIRST), rng.choice(LAST)
    shape = rng.random()
    if shape < 0.2:
        name = f"{first} {rng.choice(MIDDLE)} {last}"
    elif shape < 0.3:
        name = f"{first} {rng.choice(string.ascii_uppercase)}. {last}"
    elif shape < 0.4:
        name = last
    else:
        name = f"{first} {last}"
    if rng.random() < titled:
        return [(rng.choice(TITLES) + " ", None), (name, "PER")]
    return [(name, "PER")]


def organisation(rng: random.Random) -> list[tuple[str, str | None]]:
    shape = rng.random()
    if shape < 0.35:
        words = [rng.choice(COMPANY_STEMS), rng.choice(COMPANY_KINDS), rng.choice(COMPANY_ENDS)]
        return [(" ".join(w for w in words if w), "ORG")]
    if shape < 0.5:
        return [("the ", None), (rng.choice(SCHOOL_KINDS).format(_city(rng)), "ORG")]
    if shape < 0.65:
        return [("the ", None), (f"{rng.choice(NATIONALITIES)} {rng.choice(NATIONAL_ORGS)}", "ORG")]
    if shape < 0.75:
        kind = rng.choice(["Central Bank of {}", "{} City Council", "{} United", "FC {}"])
        return [("the ", None) if "of" in kind else ("", None), (kind.format(_city(rng)), "ORG")]
    name = rng.choice(ORGS)
    if name[0].isupper() and len(name.split()) > 1 and rng.random() < 0.7:
        return [("the ", None), (name, "ORG")]
    return [(name, "ORG")]


def _city(rng: random.Random) -> str:
    return rng.choice([p for p in PLACES[:40] if " " not in p])


def place(rng: random.Random) -> list[tuple[str, str | None]]:
    if rng.random() < 0.3:  # the shapes of many-word names, on made-up stems
        return [(rng.choice(PLACE_SHAPES).format(rng.choice(PLACE_STEMS)), "LOC")]
    name = rng.choice(PLACES)
    if name in ("Rocky Mountains", "Black Forest", "Sahara"):
        return [("the ", None), (name, "LOC")]
    return [(name, "LOC")]


def misc(rng: random.Random) -> list[tuple[str, str | None]]:
    return [("the ", None), (rng.choice(EVENTS), "MISC")]


# {PER} {LOC} {ORG} {EVENT}: entities; {NAT} {LANG}: MISC adjectives and languages; {DAY}
# {MONTH} {JOB} {N}: plain words.
NER_TEMPLATES = [
    "{PER} flew from {LOC} to {LOC} on {DAY}.",
    "{PER} spoke to reporters in {LOC} on {DAY} afternoon.",
    "{ORG} said on {DAY} it would cut {N} jobs in {LOC}.",
    "{PER}, a {NAT} {JOB}, works for {ORG}.",
    "The {NAT} team won {EVENT} in {LOC}.",
    "Shares in {ORG} rose {N} percent after the deal with {ORG}.",
    "{PER} studied law at {ORG} before joining {ORG}.",
    "Flights between {LOC} and {LOC} were cancelled because of the storm.",
    "According to {ORG}, tourism in {LOC} grew last year.",
    "{PER} and {PER} first met at {EVENT}.",
    "She was born in {LOC} and grew up in {LOC}.",
    "{LOC} is home to more than {N} million people.",
    "{EVENT} returns to {LOC} in {MONTH}.",
    "{ORG} hired {PER} as its new chief executive.",
    "Police in {LOC} are looking for a {NAT} tourist.",
    "{PER} of {ORG} told the {NAT} press that prices would fall.",
    "Residents of {LOC} voted on {DAY}.",
    "{PER} speaks {LANG} and a little {LANG}.",
    "{PER} moved to {LOC} in {YEAR} to work for {ORG}.",
    "In {YEAR}, {ORG} opened a research centre in {LOC}.",
    "The {NAT} government and {ORG} signed the agreement in {YEAR}.",
    "{PER} will lead the {NAT} delegation in {YEAR}.",
    "My sister works at {ORG} in {LOC}.",
    "We visited {LOC} and {LOC} last {MONTH}.",
    "{ORG} bought {ORG} for {N} billion dollars.",
    "The mayor of {LOC}, {PER}, opened the new bridge on {DAY}.",
    "{PER} scored twice as {ORG} beat {ORG}.",
    "{NAT} and {NAT} officials will meet in {LOC} next week.",
    "A spokesman for {ORG} declined to comment.",
    "In {MONTH}, {PER} became the first {NAT} woman to win {EVENT}.",
    "Thousands of {NAT} fans watched {EVENT} on television.",
    "{PER} thanked {PER} for the support.",
    "The new factory near {LOC} belongs to {ORG}.",
    "Why did {PER} leave {ORG} so suddenly?",
    "Heavy rain hit the north of {LOC} on {DAY} night.",
    "The report by {ORG} names {PER} and {PER}.",
    "After ten years in {LOC}, the {JOB} returned to {LOC}.",
    "Tickets for {EVENT} went on sale in {MONTH}.",
    # no entities: capitalised days and months are not names
    "The meeting was moved to {DAY} because of the strike.",
    "Prices rose again in {MONTH}, the statistics office said.",
    "It rained all week, so we stayed inside and played cards.",
    "The new rules take effect on the first {DAY} of {MONTH}.",
]
WORD = re.compile(r"\w+|[^\w\s]")  # how BERT's pre-tokenizer cuts words and punctuation


def ner_sentence(template: str, rng: random.Random) -> tuple[str, list[tuple[int, int, str]]]:
    """(text, [(start, end, type)]) for one template."""
    makers = {"PER": person, "LOC": place, "ORG": organisation, "EVENT": misc}
    text, spans = "", []
    for literal, slot, _, _ in string.Formatter().parse(template):
        text += literal
        if slot is None:
            continue
        if slot in makers:
            pieces = makers[slot](rng)
            if slot == "EVENT" and text.endswith(("The ", "the ")):
                pieces = pieces[1:]  # "The {NAT} team won {EVENT}" has its own article
        elif slot in ("NAT", "LANG"):
            pieces = [(rng.choice(NATIONALITIES if slot == "NAT" else LANGUAGES), "MISC")]
        else:
            vocab = {"DAY": DAYS, "MONTH": MONTHS, "JOB": JOBS, "N": ["2", "4", "12", "300"]}
            vocab["YEAR"] = [str(y) for y in range(1990, 2040)]
            pieces = [(rng.choice(vocab[slot]), None)]
        for piece, tag in pieces:
            if not text or text.endswith(". "):
                piece = _cap(piece)
            if tag:
                spans.append((len(text), len(text) + len(piece), tag))
            text += piece
    return text, spans


def ner_examples(n: int, rng: random.Random) -> list[dict]:
    """Words as BERT's pre-tokenizer cuts them ("Inc." is two words) with IOB2 tags."""
    rows = []
    for _ in range(n):
        text, spans = ner_sentence(rng.choice(NER_TEMPLATES), rng)
        tokens, tags = [], []
        for m in WORD.finditer(text):
            tag = next((s for s in spans if s[0] <= m.start() < s[1]), None)
            if tag is None:
                tags.append("O")
            else:
                tags.append(("B-" if m.start() == tag[0] else "I-") + tag[2])
            tokens.append(m.group())
        rows.append({"tokens": tokens, "tags": tags})
    return rows


# --- the files ----------------------------------------------------------------------------------


def write_demo_data(
    out: Path, seed: int = 0, sizes: dict[str, int] | None = None
) -> dict[str, Path]:
    """Writes the training files for the three demo heads (`sizes`: examples per head; QA counts
    questions); returns their paths by name: sentiment.train, ner.train, qa.train."""
    sizes = {"sentiment": 1000, "ner": 1000, "qa": 1000, **(sizes or {})}
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    sentiment = out / "sentiment.train.jsonl"
    sentiment.write_text(
        "".join(json.dumps(r) + "\n" for r in sentiment_examples(sizes["sentiment"], rng))
    )
    ner = out / "ner.train.jsonl"
    ner.write_text("".join(json.dumps(r) + "\n" for r in ner_examples(sizes["ner"], rng)))
    qa = out / "qa.train.json"
    qa.write_text(json.dumps(qa_examples(sizes["qa"], rng)))
    return {"sentiment.train": sentiment, "ner.train": ner, "qa.train": qa}


@dataclass
class Args:
    out: Path = option(None, "folder for the generated files", required=True)
    seed: int = option(0, "random seed")
    n: int = option(1000, "training examples per head")


def main(argv: list[str] | None = None) -> None:
    args = parse(
        Args,
        argv,
        prog="python -m demo.data",
        summary=__doc__.split("\n\n")[0],
        examples=["python -m demo.data --out runs/demo-data     # the three training files"],
    )
    sizes = dict.fromkeys(("sentiment", "ner", "qa"), args.n)
    for name, path in write_demo_data(args.out, args.seed, sizes).items():
        print(f"{name:>16}: {path}")


if __name__ == "__main__":
    main()
