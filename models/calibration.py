"""Thresholds of the offline backends, chosen on data and recorded with how they were measured.

Cosine similarity of L2-normalised embeddings; at or above the threshold means the same person.
Where the two classes overlap, the threshold leans to the high side: two people wrongly
merged corrupt every later answer, a person split in two only costs recall.
"""

DLIB_FACE = {
    # Video tracks (mean of a clip's frames) are what m3mem matches, and they separate
    # more cleanly than single photos but with different people closer together.
    "match_threshold": 0.95,
    "measured_on": "tracks of the 11 GRID clips (10 people) and 3 talking-head clips (AOC in two "
                   "videos, Katie Hill), 2 fps; and shared/data/gt/deepface_pairs.csv, 78 photo pairs",
    "result": "video tracks: same person 0.99-1.00, different people <= 0.93 (91 pairs), "
              "so 0.95 separates all; photos: 78/78 correct at 0.88-0.92, 76/78 at 0.95",
}

RESEMBLYZER_VOICE = {
    "match_threshold": 0.725,
    "measured_on": "ami_tst00/01 and pyannote_sample: 12 single-speaker stretches of >= 1 s cut at the RTTM turns",
    "result": "same speaker mean 0.79 (10 pairs), different mean 0.57 (20 pairs); "
              "balanced accuracy 0.80 on the plateau 0.65-0.725, 0.65 at 0.80",
}
