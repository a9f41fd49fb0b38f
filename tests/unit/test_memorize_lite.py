import numpy as np

from m3mem.records import Clip, ClipPerception, FaceTrack, SpeechSegment, l2_normalize
from pipelines.memorize import memorize_lite, spans


def _track(local_id, times):
    return FaceTrack(local_id, tuple(times), l2_normalize(np.ones(4)), 1.0, 1.0)


def test_people_seen_one_after_the_other_are_not_said_to_be_together():
    p = ClipPerception(Clip("v", 0, 0, 30), faces=(_track(0, [0.5, 1.5]), _track(1, [10.5, 11.5])),
                       sample_times_s=tuple(k + 0.5 for k in range(30)))
    mem = memorize_lite(p, {"faces": {"0": "face_1", "1": "face_2"}}, 1.0)
    assert not any("together" in line for line in mem.episodic)


def test_faces_in_one_frame_are_together_and_one_face_with_one_voice_is_an_equivalence():
    seg = SpeechSegment(2.0, 4.0, "hello there", embedding=l2_normalize(np.ones(4)))
    p = ClipPerception(
        Clip("v", 0, 0, 30),
        faces=(_track(0, [0.5, 1.5, 2.5, 3.5]), _track(1, [0.5])),
        speech=(seg,),
        sample_times_s=tuple(k + 0.5 for k in range(30)),
    )
    mem = memorize_lite(p, {"faces": {"0": "face_1", "1": "face_2"}, "voices": {"0": "voice_7"}}, 1.0)
    assert any("<face_1> and <face_2> are seen together" in line for line in mem.episodic)
    assert '<voice_7> says at 0:02: "hello there"' in mem.episodic
    assert mem.semantic == ("Equivalence: <face_1>, <voice_7>",)


def test_two_faces_on_screen_while_a_voice_speaks_give_no_equivalence():
    seg = SpeechSegment(0.0, 3.0, "who said it", embedding=l2_normalize(np.ones(4)))
    p = ClipPerception(Clip("v", 0, 0, 30), faces=(_track(0, [0.5, 1.5, 2.5]), _track(1, [0.5, 1.5, 2.5])),
                       speech=(seg,), sample_times_s=tuple(k + 0.5 for k in range(30)))
    mem = memorize_lite(p, {"faces": {"0": "face_1", "1": "face_2"}, "voices": {"0": "voice_1"}}, 1.0)
    assert mem.semantic == ()


def test_sample_times_merge_into_spans_and_gaps_split_them():
    assert spans([0.5, 1.5, 2.5, 6.5], 1.0) == [(0.0, 3.0), (6.0, 7.0)]
