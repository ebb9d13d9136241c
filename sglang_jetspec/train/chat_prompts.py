"""General-assistant chat prompts, built offline from templates, for chat training data and a chat draft corpus.

The code-mix set's chat share is almost all about Python functions; a chat answer from the target
(explanations, lists of tips, emails, short poems, recipes, comparisons) has its own recurring
phrasing, and the drafter can only propose that phrasing if the target's own chat answers are in its
data. Each template's placeholders name the kind of subject it takes; subjects come from pools by kind, so every
prompt reads naturally. Deterministic for a seed. The first `HELDOUT_TUNE` distinct prompts of the
draw are a tuning set of our own and never training prompts; `bench/prompts/chat.jsonl` is the report
set, which no generated prompt equals (tests/test_chat_prompts.py).
"""

from __future__ import annotations

import itertools
import random
import string

SUBJECTS = {
    "concept": (
        "inflation",
        "compound interest",
        "machine learning",
        "climate change",
        "the water cycle",
        "supply and demand",
        "black holes",
        "vaccines",
        "the immune system",
        "plate tectonics",
        "blockchain",
        "cloud computing",
        "encryption",
        "the stock market",
        "renewable energy",
        "evolution",
        "gravity",
        "electricity",
        "the internet",
        "DNA",
        "democracy",
        "opportunity cost",
        "the greenhouse effect",
        "neural networks",
        "recycling",
        "the scientific method",
        "probability",
        "quantum computing",
        "the placebo effect",
        "interest rates",
        "globalization",
        "meditation",
        "operating systems",
        "version control",
        "compilers",
        "databases",
        "virtual memory",
        "public key cryptography",
        "the French Revolution",
        "the Renaissance",
        "the Industrial Revolution",
        "the Roman Empire",
        "the Cold War",
        "photosynthesis in plants",
        "ocean tides",
        "volcanoes",
        "earthquakes",
        "the seasons",
        "rainbows",
        "magnetism",
    ),
    "activity": (
        "learning a new language",
        "saving money",
        "running a marathon",
        "public speaking",
        "studying for exams",
        "working from home",
        "starting a small business",
        "learning to cook",
        "reducing stress",
        "staying focused",
        "planning a trip",
        "writing a novel",
        "learning to play the guitar",
        "gardening",
        "moving to a new city",
        "preparing for a job interview",
        "managing a team",
        "learning to code",
        "eating healthier",
        "reading more books",
        "taking better photos",
        "making friends as an adult",
        "keeping a journal",
        "negotiating a salary",
        "organizing a small apartment",
        "training a puppy",
        "traveling on a budget",
        "writing a cover letter",
        "giving feedback to a coworker",
        "running an effective meeting",
        "waking up early",
        "learning to swim",
    ),
    "pair": (
        ("a cat", "a dog"),
        ("renting", "buying a home"),
        ("tea", "coffee"),
        ("Python", "Java"),
        ("SQL", "NoSQL databases"),
        ("a laptop", "a desktop computer"),
        ("stocks", "bonds"),
        ("weather", "climate"),
        ("a virus", "a bacterium"),
        ("RAM", "storage"),
        ("HTTP", "HTTPS"),
        ("a compiler", "an interpreter"),
        ("machine learning", "deep learning"),
        ("a credit card", "a debit card"),
        ("baking soda", "baking powder"),
        ("an LLC", "a sole proprietorship"),
        ("Git merge", "Git rebase"),
        ("a process", "a thread"),
        ("speed", "velocity"),
        ("mitosis", "meiosis"),
        ("a crocodile", "an alligator"),
        ("email", "instant messaging at work"),
        ("yoga", "pilates"),
        ("frontend", "backend development"),
    ),
    "dish": (
        "banana bread",
        "a vegetable stir-fry",
        "pancakes",
        "guacamole",
        "chicken soup",
        "a Greek salad",
        "chocolate chip cookies",
        "fried rice",
        "lentil curry",
        "a fruit smoothie",
        "scrambled eggs",
        "homemade pizza dough",
        "mashed potatoes",
        "a simple omelette",
        "hummus",
        "overnight oats",
        "roasted vegetables",
        "garlic bread",
        "a mushroom risotto",
        "lemonade",
    ),
    "theme": (
        "the ocean",
        "a rainy day",
        "friendship",
        "the first snow",
        "a busy city at night",
        "a lighthouse",
        "the moon",
        "a cup of morning tea",
        "a forgotten key",
        "spring flowers",
        "a long train journey",
        "an old library",
        "the desert",
        "a summer thunderstorm",
        "a lost umbrella",
        "mountains at sunrise",
        "a quiet lake",
        "a robot learning to paint",
    ),
    "occasion": (
        "asking for a deadline extension",
        "thanking a mentor",
        "declining a meeting invitation",
        "requesting a day off",
        "introducing myself to a new team",
        "following up after a job interview",
        "apologizing for a late reply",
        "inviting colleagues to a farewell lunch",
        "asking a landlord to fix the heating",
        "welcoming a new employee",
        "reminding a client about an unpaid invoice",
        "proposing a new project idea to my manager",
        "cancelling a subscription",
        "congratulating a friend on a promotion",
        "asking a professor for a recommendation letter",
    ),
    "code_task": (
        "read a CSV file",
        "sort a list of dictionaries by a key",
        "check if a number is even",
        "count the words in a string",
        "remove whitespace from a string",
        "find the largest number in an array",
        "convert a string to an integer",
        "make an HTTP GET request",
        "merge two dictionaries",
        "get the current date",
        "shuffle a list",
        "read a text file line by line",
        "check if a key exists in a dictionary",
        "generate a random number",
        "split a string by commas",
        "capitalize the first letter of a string",
        "remove duplicates from an array",
        "sum a list of numbers",
        "write to a file",
        "format a number with two decimals",
    ),
    "language": ("Python", "JavaScript", "Java", "C++", "Go", "Rust", "Ruby", "TypeScript", "C#", "Bash", "SQL", "PHP"),
    "place": (
        "Japan",
        "Italy",
        "Canada",
        "Brazil",
        "Egypt",
        "Iceland",
        "India",
        "Mexico",
        "Norway",
        "Kenya",
        "Peru",
        "Vietnam",
        "New Zealand",
        "Morocco",
        "Greece",
        "Scotland",
        "Thailand",
        "Chile",
        "Portugal",
        "South Korea",
    ),
    "audience": (
        "a five-year-old",
        "a high school student",
        "my grandmother",
        "a new employee",
        "a complete beginner",
        "a busy executive",
    ),
    "story": (
        "Hamlet",
        "Pride and Prejudice",
        "The Odyssey",
        "Moby-Dick",
        "Cinderella",
        "Frankenstein",
        "The Great Gatsby",
        "Little Red Riding Hood",
        "Macbeth",
        "The Little Prince",
        "Alice in Wonderland",
        "Don Quixote",
    ),
    "phrase": (
        "Thank you for your help",
        "Where is the train station?",
        "I would like a cup of coffee",
        "See you tomorrow",
        "How much does this cost?",
        "Happy birthday",
        "I am learning a new language",
        "The weather is nice today",
    ),
    "number": ("three", "four", "five", "six", "seven"),
    "place_language": ("French", "Spanish", "German", "Italian", "Japanese", "Portuguese", "Dutch", "Swedish"),
}

TEMPLATES = (
    "Explain {concept} in simple terms.",
    "Explain {concept} to {audience}.",
    "What is {concept}, and why does it matter?",
    "Give me {number} facts about {concept}.",
    "What are the main causes and effects of {concept}?",
    "Write a short paragraph about {concept} for a school newsletter.",
    "What are {number} tips for {activity}?",
    "How do I get started with {activity}?",
    "What are common mistakes people make when {activity}?",
    "Give me a one-week plan for {activity}.",
    "What are the pros and cons of {activity}?",
    "What is the difference between {pair}?",
    "Should I choose {pair}? Compare them briefly.",
    "Give me a simple recipe for {dish}.",
    "What ingredients do I need for {dish}, and how long does it take?",
    "Write a short poem about {theme}.",
    "Write a haiku about {theme}.",
    "Write a very short story about {theme}.",
    "Write a limerick about {theme}.",
    "Write a polite email {occasion}.",
    "Draft a short message to my team {occasion}.",
    "How do I {code_task} in {language}?",
    "Show me how to {code_task} in {language}, with a short explanation.",
    "What is the best way to {code_task} in {language}?",
    "What should I know before visiting {place}?",
    "Plan a three-day itinerary for {place}.",
    "What foods is {place} famous for?",
    "Summarize {story} in a few sentences.",
    "Who are the main characters in {story}, and what happens to them?",
    "What is the main theme of {story}?",
    "How do you say '{phrase}' in {place_language}?",
    "Translate '{phrase}' into {place_language} and explain the grammar.",
)
HELDOUT_TUNE = 48


def _fill(kind: str, rng: random.Random) -> str:
    value = rng.choice(SUBJECTS[kind])
    return f"{value[0]} and {value[1]}" if kind == "pair" else value


def _draw(seed: int, count: int) -> list[dict]:
    """`count` distinct general-assistant prompts (templates in rotation, subjects drawn by seed)."""
    rng = random.Random(seed)
    records: list[dict] = []
    seen: set[str] = set()
    for i in itertools.count():
        if len(records) >= count or i > 50 * count:
            break
        template = TEMPLATES[i % len(TEMPLATES)]
        # each placeholder, in order of appearance, names the subject pool it draws from
        text = template.format(
            **{kind: _fill(kind, rng) for _, kind, _, _ in string.Formatter().parse(template) if kind}
        )
        if text in seen:
            continue
        seen.add(text)
        records.append({"messages": [{"role": "user", "content": text}], "source": f"chat:{i % len(TEMPLATES)}"})
    return records


def chat_prompt_records(seed: int = 0, total: int = 2000) -> list[dict]:
    """`total` training prompts: the draw after its first HELDOUT_TUNE (the tuning set)."""
    return _draw(seed, HELDOUT_TUNE + total)[HELDOUT_TUNE:]


def tuning_prompt_records(seed: int = 0) -> list[dict]:
    """Our own chat tuning prompts, never among the training prompts of the same seed."""
    return _draw(seed, HELDOUT_TUNE)


def main(argv: list[str] | None = None) -> int:
    """Write the chat tuning prompts (or --training prompts) as JSONL, e.g. bench/prompts/chat-tune.jsonl."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m sglang_jetspec.train.chat_prompts", description=main.__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--training", type=int, metavar="N", help="write the first N training prompts instead")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    records = chat_prompt_records(args.seed, args.training) if args.training else tuning_prompt_records(args.seed)
    with open(args.out, "w") as fh:
        fh.writelines(json.dumps({"messages": r["messages"]}) + "\n" for r in records)
    print(f"{len(records)} prompts written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
