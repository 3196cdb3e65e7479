"""The upload-mention scrub, including the gaps of DeerFlow's pattern (§4.7)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.memory.scrub import UPLOAD_MENTION, mentions_upload, scrub_document, scrub_text
from storage.document import Fact, MemoryDocument
from storage.sections import Section, UserContext


@pytest.mark.parametrize(
    "text",
    [
        "User uploaded a file.",
        "The user uploaded the big quarterly sales report file yesterday.",  # 4+ words between
        "She uploads file exports every week.",  # present tense
        "See /mnt/user-data/uploads/x.csv for the data.",  # path after a space
        "<uploaded_files>report.pdf</uploaded_files>",  # tag without a word before it
        "There was a file upload earlier.",
        "Uploading documents to the assistant.",
        "用户上传了一个PDF文件。",
    ],
)
def test_upload_mentions_are_detected(text: str) -> None:
    assert mentions_upload(text)


@pytest.mark.parametrize(
    "text",
    [
        "Works with CSV files.",
        "Prefers PDF export.",
        "Keeps documents in Notion.",
        "喜欢用 Excel 文件",
    ],
)
def test_ordinary_file_talk_is_kept(text: str) -> None:
    assert not mentions_upload(text)
    assert scrub_text(text) == text


def test_only_the_mentioning_sentences_are_removed_including_file_names_with_dots() -> None:
    text = "Analyses churn. Sent it to /mnt/user-data/uploads/data.csv. Next   we plot v2.0 charts!"
    assert scrub_text(text) == "Analyses churn. Next we plot v2.0 charts!"
    assert scrub_text("用户上传了文件。喜欢茶。") == "喜欢茶。"


def test_document_scrub_cleans_summaries_and_drops_facts_but_not_manual_ones() -> None:
    doc = MemoryDocument(
        user=UserContext(top_of_mind=Section(summary="Uploaded the deck file. Prepares a talk.")),
        facts=[
            Fact(id="a", content="Uploaded report.pdf for review"),
            Fact(id="b", content="Uploaded files are in /mnt/user-data/uploads", source="manual"),
            Fact(id="c", content="Prefers PDF export"),
        ],
    )
    cleaned, changes = scrub_document(doc, source_thread_id="t1")
    assert cleaned.user.top_of_mind.summary == "Prepares a talk."
    assert [f.id for f in cleaned.facts] == ["b", "c"]
    assert sorted(c.action for c in changes) == ["remove", "summary"]
    assert doc.facts[0].id == "a"  # the input is untouched


@given(
    st.lists(
        st.sampled_from(
            [
                "upload",
                "UPLOADED",
                "Uploads",
                "file",
                "files",
                "the",
                "report.pdf",
                " ",
                "上传",
                "了",
                "文件",
                "/mnt/user-data/uploads",
                "<uploaded_files>",
                "</current_uploads>",
                "ſ",
                "K",
                "İ",
                "x",
            ]
        )
    ).map("".join)
)
def test_the_quick_rule_out_never_hides_a_mention(text: str) -> None:
    """mentions_upload rules text out by substring before the pattern runs: it must say what
    the pattern alone says, whatever the case, the script or the tag."""
    assert mentions_upload(text) == (UPLOAD_MENTION.search(text) is not None)
