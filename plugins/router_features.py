"""What svc/smart's local classifier looks at, as numbers.

A request is judged by what its last user turn asks. That turn is split into the question
and any long pasted text (an e-mail, a log, a file): the question gives hashed character
n-grams, which carry across languages and scripts; the pasted text only counts by its size
and shape, so a long paste with a trivial question stays easy. Structure (code, maths
notation, how many numbers and clauses, tools, earlier turns) adds a few dense features.
The same function (`keyed_features`) serves training and the gateway, so they can never
disagree: training hashes the known keys into slots, the gateway looks them up in the model's table.
"""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

BUCKETS = 1 << 16                 # hashed n-gram slots; the dense features follow them
NGRAMS = (1, 2, 4)              # character n-gram lengths (chosen on validation: as exact as 2-5, half the keys)
QUESTION_CAP = 320                # characters of question that give n-grams (head and tail): bounds the time
LONG_TURN = 700                   # a turn longer than this may carry pasted context
HISTORY_CAP = 300                 # characters of earlier turns that give word features
SCAN_CAP = 300                    # characters of question that the markers and counts read
CODE_SCAN_CAP = 4000              # characters of the last turn searched for signs of code

# Markers of what a request asks for, in the eight languages of the labelled set, matched
# as plain substrings of the lowercased question with punctuation turned into spaces (a
# leading space marks the start of a word). They are only features: the model learns how
# much each counts next to everything else (a "who proved ..." question is a lookup).
LEXICON = {
    "lookup": (" who ", " when ", " where ", " which ", " what year", " how many", " how tall", " quién", " quien ", " cuándo",
               " dónde", " cuánt", " qui ", " quand ", " où ", " combien", " wer ", " wann ", " wo ", " welche", " wie viele",
               " wie hoch", " кто ", " когда", " где ", " сколько", " quem ", " quando ", " onde ", " quant", " qual ", "谁", "哪",
               "几", "多少", "誰", "いつ", "どこ", "いくつ", "何年"),
    "brief": (" one word", " one line", " one sentence", " yes or no", " yes no", " just the ", " en una frase", " en una línea",
              " en une phrase", " in einem satz", " ein satz", " одной фразой", " одно предложение", "一句话", "一文で",
              " numa frase", " uma frase", " short answer", " respuesta corta"),
    "prove": (" prove", " proof", " show that", " demuestra", " démontre", " demontre", " montre que", " beweise", " zeige",
              " zeig ", " докажи", " prova ", " mostra que", " demonstra", "证明", "証明", "示して"),
    "derive": (" derive", " deriva", " dérive", " leite ", " herleit", " выведи", " deduz", " reason through", " razona",
               " raisonne", "推导", "導出", "導いて"),
    "design": (" design", " architect", " diseña", " conçois", " entwirf", " entwerfe", " спроектируй", " projeta",
               " plan the", " planifica", " planifie", " plane ", " спланируй", "设计", "設計", "规划", "計画"),
    "implement": (" implement", " write a function", " write a parser", " implementa", " implémente", " implementiere",
                  " реализуй", "实现", "実装"),
    "debug": (" why does", " why is ", " why do ", " bug", " crash", " leak", " deadlock", " race ", " fails", " por qué",
              " pourquoi", " warum", " почему", " por que", "为什么", "なぜ", "死锁"),
    "explain": (" explain", " explica", " explique", " erklär", " erklar", " объясни", " compare", " compara", " vergleiche",
                " сравни", "解释", "说明", "説明", "比较", "比較"),
    "write": (" write", " draft", " escribe", " redacta", " écris", " rédige", " schreib", " verfasse", " напиши", " составь",
              " escreve", " escreva", "写一", "写个", "書いて", "作って", "作成"),
    "translate": (" translate", " traduc", " traduz", " traduis", " übersetz", " переведи", " how do you say", " how do i say",
                  " cómo se dice", " comment dit on", " was heißt", " как по ", " как будет", "翻译", "訳して", "英語で"),
    "greet": (" hi ", " hey ", " hello", " yo ", " thanks", " thank you", " thx", " cheers", " hola", " gracias", " salut",
              " bonjour", " merci", " hallo", " danke", " привет", " спасибо", " oi ", " olá", " obrigad", " valeu", "你好",
              "谢谢", "こんにちは", "ありがとう"),
    "scale": (" million", " millones", " millionen", " миллион", " milhões", " multi region", " regions", " regiones",
              " régions", " регион", " zero downtime", " without downtime", " sin parar", " sans interruption", " ohne ausfall",
              " ohne unterbrechung", " без остановки", " sem parar", " rollback", " failure", " fallos", " pannes",
              " ausfall", " отказ", " falhas", "万", "亿", "不停机", "无停机", "無停止", "故障", "障害"),
    "expert": (" conflicting", " contradict", " contradictoire", " widerspr", " противоречив", " contradit", " specialist",
               " especialista", " spécialiste", " facharzt", " специалист", " jurisdiction", " jurisdicci", " juridiction",
               " formal verif", " formally verif", " threat model", " modelo de amenazas", " modèle de menaces",
               " bedrohungsmodell", " модель угроз", "矛盾", "专科", "専門医", "威胁建模", "脅威モデル"),
    "all": (" find all", " determine all", " all integers", " all positive integers", " todos los", " tous les entiers",
            " alle paare", " alle ganzen", " все функции", " все целые", " todos os inteiros", " complete proof", " full proof",
            " prueba completa", " preuve complète", " vollständig", "所有", "すべての"),
}
_PUNCT = re.compile(r"[^\w\s]+")

DENSE = ("bias", "q_len", "ctx_len", "has_ctx", "code", "math", "numbers", "clauses", "lines", "questions",
         "tools", "tool_results", "turns", "history_len", "cjk", *LEXICON,
         "q<30", "q<80", "q<160", "q<300", "q<600", "n>=3", "n>=6", "c>=3", "c>=6")
FEATURES = BUCKETS + len(DENSE)

SEPARATORS = ("\n\n", "```", '"""', "\n---")
_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")
_WORDS = re.compile(r"\w{2,}")
_MATH = re.compile(r"[∑∫√π≤≥∞±×÷∀∃∈⊂ℝℕℤℚ²³⁴ⁿ₀₁₂χζφΔδε^]|\\(?:frac|sum|int|sqrt|mathbb)|\b[a-z]\s*[=<>]\s*\d")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")
_CLAUSE_MARKS = (",", ";", "，", "、", "；", " and ", " und ", " et ", " y ")
_CODE_MARKS = ("```", ";\n", "{\n", "}\n", "def ", "return ", "=>", "#include", "SELECT ", "func ", "fn ")


@dataclass(slots=True)
class RoutingInput:
    """The parts of a chat request the classifier reads."""
    last: str                  # the last user turn's text
    history: str = ""          # earlier turns (user and assistant), most recent last
    tools: int = 0             # how many tools the request offers
    tool_results: bool = False  # the conversation already carries tool results


def from_messages(messages: list[tuple[str, str, bool]], tools: int) -> RoutingInput:
    """`messages`: (role, text, is_tool_result) in order, system turns included."""
    last_at = next((i for i in range(len(messages) - 1, -1, -1)
                    if messages[i][0] == "user" and messages[i][1].strip() and not messages[i][2]), None)
    if last_at is None:
        return RoutingInput("", tools=tools)
    earlier = [text for role, text, _ in messages[:last_at] if role in ("user", "assistant") and text]
    return RoutingInput(messages[last_at][1], " ".join(earlier)[-2000:], tools,
                        any(result for _, _, result in messages))


def split_question(text: str) -> tuple[str, int]:
    """-> (the question, how many characters of pasted context surround it).

    The question is the short first or last block of a long turn (blocks end at a blank
    line, a code fence, triple quotes or a `---` rule); found with `str.find`, so a long
    paste costs next to nothing."""
    text = text.strip()
    if len(text) <= LONG_TURN:
        return text, 0
    starts = [i for i in (text.find(mark) for mark in SEPARATORS) if i > 0]
    ends = [i + len(mark) for mark, i in ((mark, text.rfind(mark)) for mark in SEPARATORS) if i > 0]
    head = text[:min(starts)].strip() if starts else ""
    tail = text[max(ends):].strip() if ends else ""
    short = [block for block in (head, tail) if block and len(block) <= 500]
    if not short:
        lines = [line for line in (text[:400].splitlines()[:1] + text[-400:].splitlines()[-1:]) if line.strip()]
        short = [line[:300] for line in lines]
    asking = [block for block in short if "?" in block or "？" in block]
    if len(asking) == 1:                 # of a title and a question, the question
        short = asking
    question = "\n".join(dict.fromkeys(short))
    return question, max(0, len(text) - len(question))


def _normalise(text: str) -> str:
    """Lowercased, digits as 0, runs of space as one; the head and tail of a long question."""
    if len(text) > QUESTION_CAP:
        head = QUESTION_CAP * 3 // 5
        text = text[:head] + " … " + text[-(QUESTION_CAP - head):]
    return f" {_SPACE.sub(' ', _DIGITS.sub('0', text.lower()))} "


def _ends(text: str, cap: int) -> str:
    """The head and tail of a long text, `cap` characters in all: what the counts look at."""
    return text if len(text) <= cap else text[:cap * 3 // 4] + "\n" + text[-(cap // 4):]


def _log(n: float) -> float:
    return math.log1p(n) / 4.0


def slot(key: str) -> int:
    """Where a key's weight lives among the hashed slots (training fits those slots)."""
    return zlib.crc32(key.encode()) & (BUCKETS - 1)


def keyed_features(inp: RoutingInput) -> tuple[set[str], float, list[float]]:
    """-> (the request's keys: character n-grams of the question, its words and word pairs,
    words of earlier turns; the weight of each; dense feature values in DENSE order).

    The keys come as a set: each counts once, and the gateway only sums their weights, so
    their order does not matter (a set is cheaper to build than an ordered dict). The gateway
    looks the keys up in the model's table of known keys (a dict lookup is cheaper than
    hashing each one); training hashes them into slots."""
    question, context = split_question(inp.last)
    norm = _normalise(question)
    keys = {norm[i:i + n] for n in NGRAMS for i in range(len(norm) - n + 1)}
    words = _WORDS.findall(norm)
    keys.update(map("\x01".__add__, words))
    keys.update(map("\x02{} {}".format, words, words[1:]))
    keys.update(map("\x03".__add__, _WORDS.findall(inp.history[-HISTORY_CAP:].lower())))
    weight = 1.0 / math.sqrt(len(keys)) if keys else 0.0
    scan = _ends(question, SCAN_CAP)
    cjk_share = len(_CJK.findall(scan)) / max(1, len(scan))
    q_len = len(question) * (1 + 2 * cjk_share)          # a CJK character says about as much as three
    code = sum(map(_ends(inp.last, CODE_SCAN_CAP).count, _CODE_MARKS))
    clauses = sum(map(scan.count, _CLAUSE_MARKS))
    numbers = len(_DIGITS.findall(scan))
    dense = [1.0, _log(q_len), _log(context), 1.0 if context else 0.0, _log(code),
             _log(len(_MATH.findall(scan))), _log(numbers), _log(clauses),
             _log(question.count("\n")), _log(question.count("?") + question.count("？")),
             _log(inp.tools), 1.0 if inp.tool_results else 0.0, 1.0 if inp.history else 0.0,
             _log(len(inp.history)), cjk_share]
    plain = " " + " ".join(_PUNCT.sub(" ", scan.lower()).split()) + " "
    dense += [1.0 if any(map(plain.__contains__, marks)) else 0.0 for marks in LEXICON.values()]
    dense += [float(q_len < cut) for cut in (30, 80, 160, 300, 600)]
    dense += [float(numbers >= 3), float(numbers >= 6), float(clauses >= 3), float(clauses >= 6)]
    return keys, weight, dense
