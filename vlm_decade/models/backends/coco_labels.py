"""The COCO label map of the TensorFlow SSD detectors, and how to write each label in a sentence.

TensorFlow's detection model zoo numbers COCO classes 1-90 after the original 91-category list; the
ids of the categories COCO never annotated (12 street sign, 26 hat, 29 shoe, 30 eye glasses, 45 plate,
66 mirror, 68 window, 69 desk, 71 door, 83 blender, 91 hair brush) are gaps, so 80 ids carry a label.
"""

from __future__ import annotations

COCO_LABELS: dict[int, str] = {
    1: "person",
    2: "bicycle",
    3: "car",
    4: "motorcycle",
    5: "airplane",
    6: "bus",
    7: "train",
    8: "truck",
    9: "boat",
    10: "traffic light",
    11: "fire hydrant",
    13: "stop sign",
    14: "parking meter",
    15: "bench",
    16: "bird",
    17: "cat",
    18: "dog",
    19: "horse",
    20: "sheep",
    21: "cow",
    22: "elephant",
    23: "bear",
    24: "zebra",
    25: "giraffe",
    27: "backpack",
    28: "umbrella",
    31: "handbag",
    32: "tie",
    33: "suitcase",
    34: "frisbee",
    35: "skis",
    36: "snowboard",
    37: "sports ball",
    38: "kite",
    39: "baseball bat",
    40: "baseball glove",
    41: "skateboard",
    42: "surfboard",
    43: "tennis racket",
    44: "bottle",
    46: "wine glass",
    47: "cup",
    48: "fork",
    49: "knife",
    50: "spoon",
    51: "bowl",
    52: "banana",
    53: "apple",
    54: "sandwich",
    55: "orange",
    56: "broccoli",
    57: "carrot",
    58: "hot dog",
    59: "pizza",
    60: "donut",
    61: "cake",
    62: "chair",
    63: "couch",
    64: "potted plant",
    65: "bed",
    67: "dining table",
    70: "toilet",
    72: "tv",
    73: "laptop",
    74: "mouse",
    75: "remote",
    76: "keyboard",
    77: "cell phone",
    78: "microwave",
    79: "oven",
    80: "toaster",
    81: "sink",
    82: "refrigerator",
    84: "book",
    85: "clock",
    86: "vase",
    87: "scissors",
    88: "teddy bear",
    89: "hair drier",
    90: "toothbrush",
}

# Labels whose sentence form differs from the label: (singular noun phrase, plural noun).
_IRREGULAR: dict[str, tuple[str, str]] = {
    "person": ("a person", "people"),
    "sheep": ("a sheep", "sheep"),
    "mouse": ("a mouse", "mice"),
    "knife": ("a knife", "knives"),
    "skis": ("a pair of skis", "pairs of skis"),
    "scissors": ("a pair of scissors", "pairs of scissors"),
    "broccoli": ("some broccoli", "heads of broccoli"),
    "tv": ("a TV", "TVs"),
    "umbrella": ("an umbrella", "umbrellas"),
}

_NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()


def noun_phrase(label: str, count: int) -> str:
    """`label` counted in words: "a cat", "an apple", "two cups", "three people", "many cars" (> 20)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    singular, plural = _IRREGULAR.get(label, (None, None))
    if count == 1:
        return singular or f"{'an' if label[0] in 'aeio' else 'a'} {label}"
    if plural is None:
        plural = label + ("es" if label.endswith(("s", "sh", "ch", "x")) else "s")
    return f"{_NUMBERS[count] if count < len(_NUMBERS) else 'many'} {plural}"
