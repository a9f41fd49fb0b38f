"""Thresholds and measured quality of the offline backends, as data, with how they were measured.

Similarities are cosines of L2-normalised embeddings; at or above ``match_threshold`` means
the same person. Where the two classes overlap, the threshold leans to the high side: two
people wrongly merged corrupt every later answer, a person split in two only costs recall.
Media are those of ``shared/data`` (see its MANIFEST.md); the integration tests in
``tests/integration/test_offline_models.py`` re-measure the numbers they depend on.
CPU times are per second of audio or per frame, on a 2-core x86 machine, one process.
"""

DLIB_FACE = {
    "match_threshold": 0.95,
    "chosen_by": "m3mem matches video tracks (quality-weighted mean of a clip's frames), so the threshold "
                 "sits in the gap between same- and different-person tracks, nearer the different side's "
                 "ceiling plus margin; it must also keep each single-person video in one track when "
                 "frames are grouped, which fails from 0.96 up",
    "photo_pairs": {
        "data": "gt/deepface_pairs.csv: 78 pairs of web photos (12 same person), largest face of each",
        "same_person_cosine": "0.925-0.986 (12 pairs)",
        "different_person_cosine_max": 0.880,
        "accuracy_at_threshold": 76 / 78,  # 2 same-person pairs (0.925, 0.945) fall below 0.95
        "accuracy_best": 1.0,  # any threshold in 0.88-0.92
        "dlib_rule_euclidean_0.6_unnormalised": 77 / 78,  # descriptors have norm 1.43-1.62: about cosine 0.92
    },
    "video_tracks": {
        "data": "11 GRID clips (10 people, pwij3p and swwp2s the same man) and 7 talking heads "
                "(hdtf_katie_hill, hdtf_aoc_a, retalking_face1-5; face3 is AOC again), 2 fps, "
                "mean embedding of the largest face per frame",
        "same_person_cosine": [0.993, 0.997],  # pwij3p/swwp2s, hdtf_aoc_a/retalking_face3
        "different_person_cosine_max": 0.930,  # of 151 pairs (two GRID speakers)
        "accuracy_at_threshold": 1.0,
        "frames_with_a_face": "all 171 sampled frames",
        "tracks_per_single_person_video": {"0.92-0.95": 1, "0.96": "retalking_face4 splits in two"},
    },
    "detection": {
        "insightface_t1_group.jpg": 6,  # all 6 cast members
        # the photo also shows a girl's face at the lower right edge; the ground truth names the two men
        "fr_obama_and_biden.jpg": 3,
        # detection, alignment and embedding of one face; detection alone is 60-70 ms at 512 px
        # without upsampling, 250 ms at 960x540 with it
        "cpu_ms_per_frame": {"360x288 (upsampled)": 93, "512x512 (upsampled)": 133, "700-844 px square": [95, 110]},
    },
}

RESEMBLYZER_VOICE = {
    "match_threshold": 0.74,
    "chosen_by": "maximal balanced accuracy on whole single-speaker stretches (plateau 0.74-0.76), "
                 "taken at its low end because shorter pieces lose recall fast above it",
    "data": "ami_tst00/01 (the same 4 speakers) and pyannote_sample (2 speakers): stretches of >= 1 s where "
            "the RTTM has exactly one speaker; pairs within a corpus only",
    "preprocessing": "mono 16 kHz, levelled to -30 dBFS RMS (as the encoder was trained), "
                     "segments under 1.6 s repeated to 1.6 s",
    "whole_stretches": {
        "segments": 12,
        "same_speaker": {"pairs": 10, "mean": 0.815, "range": [0.762, 0.919]},
        "different_speaker": {"pairs": 20, "mean": 0.624, "range": [0.438, 0.793]},
        "at_threshold": {"true_positive_rate": 1.0, "true_negative_rate": 0.85, "balanced_accuracy": 0.925},
    },
    "pieces_of_at_most_2.5_s": {
        "segments": 19,
        "same_speaker": {"pairs": 32, "mean": 0.757, "range": [0.626, 0.869]},
        "different_speaker": {"pairs": 51, "mean": 0.613, "range": [0.426, 0.765]},
        "at_threshold": {"true_positive_rate": 0.656, "true_negative_rate": 0.961, "balanced_accuracy": 0.809},
        "best_balanced_accuracy": 0.822,  # at 0.705
    },
    "alternatives_measured": "peak normalisation: 0.850 balanced on both sets (at 0.73-0.74); "
                             "resemblyzer.preprocess_wav (with silence trimming): 0.750 / 0.762; "
                             "no levelling: 0.775 / 0.756",
    "resampling": "44.1 kHz input gives cosine 0.99997 to the 16 kHz embedding, 8 kHz input 0.975",
}

POCKETSPHINX_SPEECH = {
    "model": "pocketsphinx 5.1.1, bundled en-us acoustic model, en-us.lm.bin, cmudict-en-us.dict, default search",
    "segmentation": "pocketsphinx's WebRTC VAD, mode 2, 30 ms frames; gaps < 0.5 s merged; "
                    "regions > 15 s split at their quietest frame; 0.15 s padding at region edges",
    "wer": {
        "jfk.wav": 0.182,  # 4 of 22 words: so->all, americans->america, ask->and (twice)
        "pyannote_sample.wav": 0.716,  # 8 kHz telephone speech, two speakers
        "grid (11 clips)": 0.788,  # GRID's command grammar ("bin blue at f two now") is far from the LM
    },
    # CPU seconds per second of audio; pocketsphinx runs in one thread
    "cpu_s_per_audio_s": {"jfk.wav": 0.25, "pyannote_sample.wav": 0.25, "grid": 0.18},
    "wall_s_per_audio_s_with_other_work_on_the_cpu": 0.54,  # jfk.wav, load average about 8 on 2 cores
    "decoder_settings_measured": "fwdflat off: same WER, 5-10% faster; wider beams (1e-60/1e-40): "
                                 "pyannote WER 0.679, 1.6x slower; lw 9: jfk WER 0.409",
    "test_bound_wer_jfk": 0.3,
}
