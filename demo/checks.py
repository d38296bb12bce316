"""A hand-written check set for the demo heads, and its score through an exported package.

The items below were written by hand, in ordinary English, apart from the templates and word
lists of `demo/data.py`: other sentence shapes, other names and places (a test checks
that no entity or answer here occurs in the generated training data). They are never trained
on. The build reports each head's score on them and `make test` holds the heads to floors.

    python -m demo.checks models/demo-sentiment models/demo-ner models/demo-qa

Scores are what the server answers: the package runs in ONNX Runtime (`training.evaluate`'s
package runner) and the service's own task code turns its outputs into answers: sentiment
accuracy of the top label; NER entity precision / recall / F1 of /ner's default
`aggregation_strategy="simple"` groups, an entity counting when its type and exact character
span match; QA SQuAD exact match / F1 of /qa's best span.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heads.rows import load_package_tokenizer
from heads.tasks import classify, ner, qa, rerank, zero_shot
from training.cli import option, parse
from training.evaluate import onnx_runner, run_rows
from training.metrics import squad_scores

# (text, label). Negation, contrast, intensifiers, mixed reviews, and some with no sentiment word.
SENTIMENT = [
    ("Not bad at all.", "positive"),
    ("The service was slow, but the food was wonderful.", "positive"),
    ("Never disappointing, every single time.", "positive"),
    ("I expected to hate it, yet I ended up laughing the whole evening.", "positive"),
    ("The staff were friendly, but the room smelled of smoke and the bed was broken.", "negative"),
    ("Honestly one of the worst purchases I have made this year.", "negative"),
    ("A genuinely lovely little café with kind owners.", "positive"),
    ("I wouldn't recommend this phone to anyone.", "negative"),
    ("The plot was predictable, though the actors did a fantastic job.", "positive"),
    ("Not the best concert I have been to, but still great fun.", "positive"),
    ("Absolutely terrible customer support.", "negative"),
    ("The hotel was cheap, clean and close to the station.", "positive"),
    ("Nothing special, and far too expensive for what you get.", "negative"),
    ("My kids loved every minute of it.", "positive"),
    ("The battery dies before lunch, which makes the whole laptop useless.", "negative"),
    ("It is not great, to be honest.", "negative"),
    ("Surprisingly good for such a small budget.", "positive"),
    ("The first half drags, but the ending is superb.", "positive"),
    ("The pictures looked great online, but in person the jacket is poorly made.", "negative"),
    ("I have never been so bored in a cinema.", "negative"),
    ("Could not be happier with the repair.", "positive"),
    ("The soup was cold and the waiter ignored us.", "negative"),
    ("Fresh ingredients, generous portions and a warm welcome.", "positive"),
    ("Not worth the money.", "negative"),
    ("Hardly the masterpiece the critics promised.", "negative"),
    ("A bit noisy at night, but otherwise a perfect stay.", "positive"),
    ("The food was fine, but the service was painfully slow.", "negative"),
    ("Five stars, would happily go back.", "positive"),
    ("What a waste of an afternoon.", "negative"),
    ("The app keeps crashing and support never answers.", "negative"),
    ("An extremely pleasant surprise.", "positive"),
    ("It arrived two weeks late and the box was crushed.", "negative"),
]

# (text, [(entity text, type)]), entities in text order; each text occurs once in its sentence.
# Titles (Dr., Mr., Sir) are not part of a name, as in CoNLL-2003.
NER = [
    ("She moved to North Carolina after college.", [("North Carolina", "LOC")]),
    (
        "The European Central Bank raised interest rates again on Thursday.",
        [("European Central Bank", "ORG")],
    ),
    (
        "Dr. Helena Marques teaches history at the University of Lisbon.",
        [("Helena Marques", "PER"), ("University of Lisbon", "ORG")],
    ),
    (
        "We spent a week in New York City before flying home to Dublin.",
        [("New York City", "LOC"), ("Dublin", "LOC")],
    ),
    (
        "Bayer AG agreed to buy a small start-up based in Munich.",
        [("Bayer AG", "ORG"), ("Munich", "LOC")],
    ),
    (
        "Apple Inc. reported higher sales in China last quarter.",
        [("Apple Inc.", "ORG"), ("China", "LOC")],
    ),
    ("Professor James Alan Whitfield won the prize in 2019.", [("James Alan Whitfield", "PER")]),
    (
        "The German chancellor met Italian officials in Rome.",
        [("German", "MISC"), ("Italian", "MISC"), ("Rome", "LOC")],
    ),
    (
        "Thousands of fans travelled to Qatar for the World Cup.",
        [("Qatar", "LOC"), ("World Cup", "MISC")],
    ),
    (
        "Mr. Kofi Mensah works as an engineer for Siemens in Accra.",
        [("Kofi Mensah", "PER"), ("Siemens", "ORG"), ("Accra", "LOC")],
    ),
    (
        "The Tour de France finishes in Paris every July.",
        [("Tour de France", "MISC"), ("Paris", "LOC")],
    ),
    (
        "Samsung Electronics opened a research centre near Cambridge.",
        [("Samsung Electronics", "ORG"), ("Cambridge", "LOC")],
    ),
    (
        "Maria Fernanda Oliveira was elected mayor of São Paulo.",
        [("Maria Fernanda Oliveira", "PER"), ("São Paulo", "LOC")],
    ),
    (
        "The World Health Organization warned about a new strain of flu.",
        [("World Health Organization", "ORG")],
    ),
    (
        "Our cousins from South Africa arrived in Los Angeles yesterday.",
        [("South Africa", "LOC"), ("Los Angeles", "LOC")],
    ),
    (
        "Toyota Motor Corporation recalled thousands of cars in Canada.",
        [("Toyota Motor Corporation", "ORG"), ("Canada", "LOC")],
    ),
    (
        "Judge Patricia Okafor dismissed the case against Northwind Logistics Ltd.",
        [("Patricia Okafor", "PER"), ("Northwind Logistics Ltd", "ORG")],
    ),
    ("Many Brazilian players now play in Spain.", [("Brazilian", "MISC"), ("Spain", "LOC")]),
    ("The Bank of England kept rates unchanged.", [("Bank of England", "ORG")]),
    (
        "Ahmed Al-Sayed, a Jordanian diplomat, spoke at the United Nations.",
        [("Ahmed Al-Sayed", "PER"), ("Jordanian", "MISC"), ("United Nations", "ORG")],
    ),
    ("Tickets for the Edinburgh Festival sold out within hours.", [("Edinburgh Festival", "MISC")]),
    (
        "Lake Tahoe sits on the border between California and Nevada.",
        [("Lake Tahoe", "LOC"), ("California", "LOC"), ("Nevada", "LOC")],
    ),
    (
        "Sir David Attenborough narrated the new series for the BBC.",
        [("David Attenborough", "PER"), ("BBC", "ORG")],
    ),
    (
        "Researchers at the Massachusetts Institute of Technology built a tiny robot.",
        [("Massachusetts Institute of Technology", "ORG")],
    ),
    (
        "The Olympic Games will come to Brisbane in 2032.",
        [("Olympic Games", "MISC"), ("Brisbane", "LOC")],
    ),
    (
        "Chef Ana Lucia Torres opened her second restaurant in Mexico City.",
        [("Ana Lucia Torres", "PER"), ("Mexico City", "LOC")],
    ),
    (
        "Volvo Cars and the Swedish government signed the deal in Stockholm.",
        [("Volvo Cars", "ORG"), ("Swedish", "MISC"), ("Stockholm", "LOC")],
    ),
    (
        "Mount Kilimanjaro is the highest peak in Africa.",
        [("Mount Kilimanjaro", "LOC"), ("Africa", "LOC")],
    ),
    (
        "The French ambassador thanked Deutsche Bank for its support.",
        [("French", "MISC"), ("Deutsche Bank", "ORG")],
    ),
    (
        "Hiroshi Yamamoto left Sony last spring to start his own company in Osaka.",
        [("Hiroshi Yamamoto", "PER"), ("Sony", "ORG"), ("Osaka", "LOC")],
    ),
    ("Police in Rio de Janeiro arrested two men on Sunday.", [("Rio de Janeiro", "LOC")]),
    (
        "The Canadian Red Cross sent volunteers to British Columbia.",
        [("Canadian Red Cross", "ORG"), ("British Columbia", "LOC")],
    ),
]

# (context, [(question, [accepted answers, each a span of the context])]).
QA = [
    (
        "The Kessler Bridge spans the river between the old town and the harbour district. "
        "Work on the bridge began in March 2011 and took almost four years. It opened to "
        "traffic on 14 February 2015, two months later than planned. In the first week, about "
        "38,000 cars crossed it, and the final bill came to 212 million euros.",
        [
            ("When did the bridge open to traffic?", ["14 February 2015"]),
            ("How many cars crossed in the first week?", ["38,000", "about 38,000"]),
            ("How long did the work take?", ["almost four years", "four years"]),
            ("How much did the bridge cost?", ["212 million euros"]),
            ("When did work on the bridge begin?", ["March 2011"]),
        ],
    ),
    (
        "Ada Lovelace was born in London on 10 December 1815. She was the only legitimate "
        "child of the poet Lord Byron. In 1843 she published notes on Charles Babbage's "
        "Analytical Engine, which included what many consider the first computer program. "
        "She died in 1852 at the age of 36.",
        [
            ("When was Ada Lovelace born?", ["10 December 1815"]),
            ("Where was Ada Lovelace born?", ["London"]),
            ("In which year did she publish her notes?", ["1843"]),
            ("How old was she when she died?", ["36"]),
            ("Who designed the Analytical Engine?", ["Charles Babbage"]),
        ],
    ),
    (
        "Harbour Lane Coffee was founded in 2009 by two sisters, Grace and Olivia Chen, in a "
        "small shop in Leeds. By 2020 the company ran 45 cafés and employed about 600 people. "
        "Last year it sold its roasting business for £8.5 million. The sisters still own 70 "
        "percent of the shares.",
        [
            ("Who founded Harbour Lane Coffee?", ["Grace and Olivia Chen", "two sisters"]),
            ("When was the company founded?", ["2009"]),
            ("How many cafés did the company run by 2020?", ["45"]),
            ("How many people did it employ?", ["about 600", "600"]),
            ("How much did it sell the roasting business for?", ["£8.5 million"]),
            ("Where was the first shop?", ["Leeds"]),
        ],
    ),
    (
        "The expedition left Punta Arenas on 3 November 1998 with eleven members. It reached "
        "the South Pole 52 days later. The team covered roughly 1,100 kilometres on skis. "
        "Funding of $400,000 came from a mining company, while a university paid for the "
        "equipment.",
        [
            ("When did the expedition leave Punta Arenas?", ["3 November 1998"]),
            ("How many members did the expedition have?", ["eleven"]),
            ("How long did it take to reach the South Pole?", ["52 days"]),
            ("How much money came from the mining company?", ["$400,000"]),
            ("How far did the team travel?", ["roughly 1,100 kilometres", "1,100 kilometres"]),
        ],
    ),
    (
        "The town museum reopened in April 2019 after a renovation that lasted eighteen months "
        "and cost 3.2 million dollars. It now shows around 4,000 objects, twice as many as "
        "before. Entry costs 12 dollars for adults, and children under ten get in free. The "
        "museum was first opened in 1921 by the local historian Margaret Ellis.",
        [
            ("When did the museum reopen?", ["April 2019"]),
            ("How long did the renovation last?", ["eighteen months"]),
            ("How much did the renovation cost?", ["3.2 million dollars"]),
            ("How many objects does the museum show?", ["around 4,000", "4,000"]),
            ("How much is entry for adults?", ["12 dollars"]),
            ("Who first opened the museum?", ["Margaret Ellis", "local historian Margaret Ellis"]),
            ("In which year was the museum first opened?", ["1921"]),
        ],
    ),
    (
        "Lena Vogt won her first marathon in Berlin in 2016, finishing in 2 hours and 24 "
        "minutes. Three years later she set a national record in Chicago. She retired in 2022 "
        "after a knee injury and now coaches a running club in Hamburg with 150 members.",
        [
            ("Where did Lena Vogt win her first marathon?", ["Berlin"]),
            ("How long did it take her to finish?", ["2 hours and 24 minutes"]),
            ("When did she retire?", ["2022"]),
            ("How many members does her club have?", ["150"]),
            ("Where did she set a national record?", ["Chicago"]),
        ],
    ),
]


# (query, documents, index of the one that answers it): other subjects, sentence shapes and
# values than demo/qa_data.py's, with distractors about the same subject.
RERANK = [
    (
        "When did the museum open?",
        [
            "The museum has four floors of paintings.",
            "Its doors first opened to visitors in April 1961.",
            "Tickets cost twelve euros.",
        ],
        1,
    ),
    (
        "Who founded Larkspur Analytics?",
        [
            "Larkspur Analytics employs 340 people in Oslo.",
            "Larkspur Analytics was started by Ines Vartanian in 2009.",
            "Its software is used by hospitals.",
        ],
        1,
    ),
    (
        "How much did the new stadium cost?",
        [
            "The new stadium cost 410 million pounds to build.",
            "The new stadium holds 52,000 fans.",
            "It was designed by a firm from Madrid.",
        ],
        0,
    ),
    (
        "Where was Tomas Lindqvist born?",
        [
            "Tomas Lindqvist won two national titles.",
            "He retired from racing at 35.",
            "Tomas Lindqvist was born in Uppsala in 1978.",
        ],
        2,
    ),
    (
        "How many people attended the book fair?",
        [
            "The book fair took place in Leipzig.",
            "Around 86,000 people came to the book fair this year.",
            "The fair lasted five days.",
        ],
        1,
    ),
    (
        "How long did the renovation take?",
        [
            "The renovation took three years.",
            "The renovation was paid for by the city.",
            "The hall reopened in May.",
        ],
        0,
    ),
    (
        "Which company makes the Orbit scooter?",
        [
            "The Orbit scooter has a range of 40 km.",
            "The Orbit scooter is sold in nine countries.",
            "Velora Mobility builds the Orbit scooter in its Lyon factory.",
        ],
        2,
    ),
    (
        "What did Hana Okafor study?",
        [
            "Hana Okafor studied chemistry at university.",
            "Hana Okafor moved to Nairobi in 2004.",
            "She has two daughters.",
        ],
        0,
    ),
]
# (text, candidate labels, template or None for the pipeline's default, the right label): the
# demo NLI model's topics, in sentences of other shapes than the QA grammar's.
ZERO_SHOT = [
    ("The tower was completed in 1889 and is 330 metres tall.",
     ["buildings", "business", "a person"], "This text is about {}.", "buildings"),
    ("Quentin Marsh was born in Leeds and studied law before becoming a judge.",
     ["buildings", "a person", "an event"], "This text is about {}.", "a person"),
    ("Brightwave Ltd reported a profit of 3 million dollars and opened 40 new offices.",
     ["business", "an event", "architecture"], "This text is about {}.", "business"),
    ("The regatta was held in Valencia in June, and 900 sailors took part.",
     ["an event", "business", "a person"], "This text is about {}.", "an event"),
    ("Its glass roof covers a hall where trains from six countries arrive.",
     ["architecture", "people", "events"], "The topic is {}.", "architecture"),
    ("She wrote four novels and taught history in Accra for twenty years.",
     ["a company", "a person", "buildings"], None, "a person"),
    ("Shares of the carmaker fell after it cut 2,000 jobs.",
     ["business", "buildings", "an event"], None, "business"),
    ("More than 40,000 runners crossed the finish line of the race on Sunday.",
     ["people", "a company", "events"], "This example is about {}.", "events"),
]  # fmt: skip


def _run_job(runner: Any, tokenizer: Any, job: Any) -> list[Any]:
    """A task job's answers as the server gives them: its rows through the package."""
    encodings = [tokenizer.encode(t, add_special_tokens=False) for t in job.texts]
    return job.answer(run_rows(runner, job.rows(tokenizer, encodings), 16, None))


def _entity_spans(text: str, entities: list[tuple[str, str]]) -> set[tuple[int, int, str]]:
    """(start, end, type) character spans, found left to right."""
    spans, at = set(), 0
    for surface, typ in entities:
        start = text.index(surface, at)
        spans.add((start, start + len(surface), typ))
        at = start + len(surface)
    return spans


def _f1(found: int, predicted: int, gold: int) -> dict[str, float]:
    p = found / predicted if predicted else 0.0
    r = found / gold if gold else 0.0
    return {"precision": 100 * p, "recall": 100 * r, "f1": 200 * p * r / (p + r) if p + r else 0.0}


def score_package(package_dir: str | Path, show_errors: bool = False) -> dict[str, float]:
    """Score one demo package on its head's items; percentages. `show_errors` prints misses."""
    runner, package = onnx_runner(package_dir)
    tokenizer = load_package_tokenizer(package.tokenizer_path)
    msl, misses = package.max_seq_length, []
    labels = [label.lower() for label in package.labels or []]
    if package.task == "classification" and "relevant" in labels:
        right = 0
        for query, documents, gold in RERANK:
            job = rerank.Job(package, documents, rerank.Options(query=query))
            best = _run_job(runner, tokenizer, job)[0]
            right += best["index"] == gold
            if best["index"] != gold:
                misses.append(f"{query!r}: {documents[best['index']]!r} {best['score']:.2f}")
        scores = {"accuracy": 100 * right / len(RERANK)}
    elif package.task == "classification" and any(lb.startswith("entail") for lb in labels):
        right = 0
        for text, candidates, hypothesis, gold in ZERO_SHOT:
            extra = {"hypothesis_template": hypothesis} if hypothesis else {}
            options = zero_shot.Options(candidate_labels=candidates, **extra)
            job = zero_shot.Job(package, [text], options)
            ans = _run_job(runner, tokenizer, job)[0]
            right += ans["labels"][0] == gold
            if ans["labels"][0] != gold:
                misses.append(f"{text!r}: {ans['labels'][0]} {ans['scores'][0]:.2f}")
        scores = {"accuracy": 100 * right / len(ZERO_SHOT)}
    elif package.task == "classification":
        texts = [t for t, _ in SENTIMENT]
        outs = run_rows(runner, classify.preprocess(tokenizer, texts, msl).sequences, 32, None)
        logits = [o["logits"] for o in outs]
        answers = classify.postprocess(logits, package.labels, package.problem_type)
        right = 0
        for (text, gold), ans in zip(SENTIMENT, answers, strict=True):
            right += ans[0]["label"] == gold
            if ans[0]["label"] != gold:
                misses.append(f"{text!r}: {ans[0]['label']} {ans[0]['score']:.2f}")
        scores = {"accuracy": 100 * right / len(SENTIMENT)}
    elif package.task == "token-classification":
        found = predicted = gold_n = 0
        for text, entities in NER:
            prepared = ner.preprocess(tokenizer, text, msl, ner.default_stride(msl))
            outs = run_rows(runner, prepared.sequences, 8, None)
            groups = ner.postprocess(prepared, outs, package.labels, "simple")
            pred = {(g["start"], g["end"], g["entity_group"]) for g in groups}
            gold = _entity_spans(text, entities)
            found, predicted, gold_n = (
                found + len(pred & gold),
                predicted + len(pred),
                gold_n + len(gold),
            )
            if pred != gold:
                misses.append(f"{text!r}: {[(text[a:b], t) for a, b, t in sorted(pred)]}")
        scores = _f1(found, predicted, gold_n)
    elif package.task == "question-answering":
        predictions, golds = [], []
        for context, questions in QA:
            for question, accepted in questions:
                prepared = qa.preprocess(tokenizer, question, context, msl, qa.default_stride(msl))
                outs = run_rows(runner, prepared.sequences, 8, None)
                best = qa.postprocess(prepared, outs, top_k=1)
                predictions.append(best[0]["answer"] if best else "")
                golds.append(accepted)
                if squad_scores(predictions[-1:], [accepted])["exact_match"] < 100:
                    misses.append(f"{question!r}: {predictions[-1]!r} (want {accepted[0]!r})")
        scores = squad_scores(predictions, golds)
    else:
        raise ValueError(f"{package_dir}: no demo checks for task {package.task!r}")
    if show_errors:
        for miss in misses:
            print(f"  miss {miss}")
    return scores


@dataclass
class Args:
    packages: list[Path] = option(None, "demo package folders to score", positional=True)
    errors: bool = option(False, "also print every item it gets wrong")


def main(argv: list[str] | None = None) -> int:
    args = parse(
        Args,
        argv,
        prog="python -m demo.checks",
        summary=__doc__.split("\n\n")[0],
        examples=["python -m demo.checks models/demo-ner --errors"],
    )
    for path in args.packages:
        scores = score_package(path, show_errors=args.errors)
        print(f"{path.name}: {json.dumps({k: round(v, 1) for k, v in scores.items()})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
