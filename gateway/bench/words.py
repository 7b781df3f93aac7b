"""The fixed vocabulary every generated prompt is drawn from.

Each word is a single cl100k token both after a space and capitalised at a sentence start,
so a prompt of n words is close to n tokens (plus the chat template), and no data file or
download is ever needed. Changing this list changes every seeded workload: don't, unless
reproducibility against old results no longer matters.
"""

from __future__ import annotations

# fmt: off
WORDS: tuple[str, ...] = (
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part",
    "place", "case", "week", "company", "system", "program", "question", "work", "government",
    "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story",
    "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue",
    "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city", "community", "name", "president", "team",
    "minute", "kid", "body", "information", "back", "parent", "face", "others", "level",
    "office", "door", "health", "person", "art", "war", "history", "party", "result", "change",
    "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force",
    "education", "foot", "boy", "age", "policy", "process", "music", "market", "sense",
    "nation", "plan", "college", "interest", "death", "experience", "effect", "use", "class",
    "control", "care", "field", "development", "role", "rate", "heart", "drug", "show",
    "leader", "light", "voice", "police", "mind", "price", "report", "decision", "son", "view",
    "relationship", "town", "road", "arm", "difference", "value", "building", "action", "model",
    "season", "tax", "director", "position", "player", "record", "paper", "space", "ground",
    "form", "event", "official", "center", "site", "project", "activity", "star", "table",
    "need", "court", "oil", "cost", "industry", "figure", "street", "image", "phone", "data",
    "picture", "practice", "piece", "land", "product", "doctor", "wall", "patient", "worker",
    "news", "test", "movie", "north", "love", "support", "technology", "step", "baby",
    "computer", "type", "attention", "film", "tree", "source", "organization", "hair", "window",
    "evidence", "population", "truth", "song", "energy", "river", "ocean", "mountain", "forest",
    "bridge", "castle", "tower", "lake", "stone", "cloud", "rain", "snow", "wind", "storm",
    "summer", "winter", "spring", "silver", "golden", "iron", "glass", "simple", "quiet",
    "bright", "dark", "early", "late", "quick", "slow", "happy", "strong", "warm", "cold",
    "fresh", "clean", "empty", "full", "heavy", "large", "small", "young", "old", "new", "good",
    "great", "little", "long", "high", "different", "important", "public", "bad", "same",
    "first", "last", "next", "few", "local", "social", "national", "special", "certain",
    "clear", "whole", "free", "human", "open", "main", "major", "real", "short", "single",
    "sure", "total", "true", "wide", "deep", "green", "blue", "red", "black", "white", "brown",
    "yellow", "orange", "purple", "apple", "coffee", "salt", "sugar", "bean", "corn", "fish",
    "chicken", "soup", "cake", "cookie", "dog", "cat", "bird", "mouse", "bear", "wolf", "fox",
    "cow", "snake", "ant", "spider", "run", "walk", "read", "write", "sing", "build", "grow",
    "learn", "speak", "listen", "watch", "follow", "bring", "hold", "keep", "move", "play",
    "pull", "push", "send", "share", "start", "stop", "talk", "think", "travel", "try", "turn",
    "wait", "close", "find", "give", "help", "know", "leave", "look", "make", "meet", "pay",
    "put", "say", "see", "take", "tell", "want", "begin", "call", "come", "feel", "get", "go",
    "have", "let", "like", "live", "mean", "set", "sit", "stand", "stay", "become", "buy",
    "catch", "choose", "cook", "count", "cover", "cross", "cut", "draw", "dream", "drink",
    "drive", "drop", "eat", "enjoy", "fall", "fight", "fill", "finish", "fly", "forget",
    "guess", "hide", "hope", "jump", "kick", "laugh", "miss", "offer", "order", "paint", "pick",
    "plant", "pour", "print", "promise", "reach", "remember", "repeat", "rest", "save",
    "search", "sell", "serve", "sleep", "throw", "touch", "trade", "train", "visit", "win",
    "wonder", "answer", "across", "after", "again", "against", "almost", "along", "already",
    "also", "always", "among", "around", "because", "before", "behind", "below", "between",
    "beyond", "both", "during", "each", "either", "enough", "even", "ever", "every", "however",
    "inside", "instead", "later", "maybe", "near", "never", "often", "once", "only", "outside",
    "perhaps", "rather", "since", "soon", "still", "then", "there", "therefore", "though",
    "through", "today", "together", "tomorrow", "under", "until", "upon", "usually", "very",
    "when", "where", "while", "within", "without", "yesterday", "yet",
)
# fmt: on
