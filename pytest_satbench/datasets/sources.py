"""Where each benchmark's official files come from, what they are checked against, and where
they unpack: the table `python -m pytest_satbench.data` reads (docs/data.md prints it).

Every URL is a base (the host: ``https://zenodo.org/``, ``https://huggingface.co/``) plus a
relative path; a mirror (``--mirror URL`` or ``$SATBENCH_DATA_MIRROR``) serves the same
relative paths under its own base.

Checksums, in the order they are used for one file:

1. ``File.checksum``: shipped here, with the page it was read from in a comment. None is
   known today: Zenodo publishes an MD5 per file and the Hub an LFS SHA-256 per large file,
   but neither was readable where this table was written, so every field is None
   ("none known") and no value is invented.
2. the checksum the source itself publishes, read at fetch time from the same host (or
   mirror): Zenodo's record API (``api/records/<id>``, ``files[].checksum = "md5:..."``) and
   the Hub's tree API (``api/datasets/<repo>/tree/<revision>/<folder>``, ``lfs.oid`` = the
   LFS SHA-256). A file whose published checksum does not match is refused.
3. otherwise trust on first use: the SHA-256 seen on the first download is written to the
   lock file beside the data (``<root>/satbench-data.lock.json``) and a later download that
   differs is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

ZENODO = "https://zenodo.org/"
NONE_KNOWN = None  # a checksum field where no published value could be read (never a guess)
HUB = "https://huggingface.co/"


@dataclass(frozen=True)
class File:
    """One file of a source.

    path: its path in the source (a Zenodo file name, a path in a Hub repository);
    dest: where it goes, relative to the data root: the file itself, or for an archive the
      folder it unpacks into;
    kind: "file", "zip" or "tar";
    top: for an archive, the folder the loader reads inside `dest` (``Images_LR``): when every
      member already starts with it the archive unpacks into `dest`, else into `dest/top`;
    members: for an archive, glob patterns of the members to unpack (empty: all; when none
      matches, all are unpacked);
    checksum: "md5:<hex>" or "sha256:<hex>" shipped here, None when none is known;
    size: bytes, None when none is known;
    only: the source's benchmarks that need it (empty: all of them)."""

    path: str
    dest: str
    kind: str = "file"
    top: str = ""
    members: tuple[str, ...] = ()
    checksum: str | None = None
    size: int | None = None
    only: tuple[str, ...] = ()  # the benchmarks of the source that read it (empty: all)


@dataclass(frozen=True)
class Listing:
    """A folder of a Hub repository whose files are fetched one by one (LHRS-Bench's images):
    its files are read from the Hub's tree API at the pinned revision."""

    path: str  # folder in the repository
    dest: str  # folder under the data root


@dataclass(frozen=True)
class Source:
    name: str
    title: str
    benchmarks: tuple[str, ...]  # the registry's benchmarks these files serve
    host: str  # "zenodo" or "hub"
    record: str  # Zenodo record id, or Hub dataset repository id
    revision: str  # Hub: the pinned commit (or "main": pinned at first use, see `pin`); Zenodo: ""
    licence: str
    homepage: str
    files: tuple[File, ...]
    listings: tuple[Listing, ...] = ()
    approx_size: str = ""  # what the user downloads, as the source's page says it
    pin: str = ""  # why the revision is what it is

    def relpath(self, path: str, revision: str | None = None) -> str:
        """The file's path under the host (or a mirror's) base URL."""
        if self.host == "zenodo":
            return f"records/{self.record}/files/{path}"
        return f"datasets/{self.record}/resolve/{revision or self.revision}/{path}"

    def api_path(self, folder: str = "", revision: str | None = None) -> str:
        """Where the source publishes its files' checksums (module docstring, step 2)."""
        if self.host == "zenodo":
            return f"api/records/{self.record}"
        rev = revision or self.revision
        return f"api/datasets/{self.record}/tree/{rev}" + (f"/{folder}" if folder else "")


SOURCES: tuple[Source, ...] = (
    Source(
        name="rsvqa_lr",
        title="RSVQA-LR (Lobry et al. 2020), Zenodo v1.0",
        benchmarks=("rsvqa_lr",),
        host="zenodo",
        # record id: the RSVQA project page links it; big_vision's rsvqa_lr.py docstring
        # ("download and unzip the dataset from https://zenodo.org/records/6344334")
        record="6344334",
        revision="",
        licence="CC BY 4.0 (Zenodo record)",
        homepage="https://rsvqa.sylvainlobry.com/",
        files=(
            # the file names the loaders read (syvlo/RSVQA AutomaticDB/Splits.py writes them).
            # Zenodo's MD5s of this record: none known here (its record page and API were not
            # readable); read from the record API at fetch time
            File("LR_split_test_questions.json", "RSVQA-LR/LR_split_test_questions.json", checksum=NONE_KNOWN),
            File("LR_split_test_answers.json", "RSVQA-LR/LR_split_test_answers.json", checksum=NONE_KNOWN),
            # Images_LR/<img_id>.tif (big_vision rsvqa_lr.py, torchrs image_root="Images_LR")
            File("Images_LR.zip", "RSVQA-LR", kind="zip", top="Images_LR", checksum=NONE_KNOWN),
        ),
        approx_size="about 200 MB (big_vision's docstring)",
    ),
    Source(
        name="rsvqa_hr",
        title="RSVQA-HR test sets 1 and 2 (Philadelphia), Zenodo v1.0",
        benchmarks=("rsvqa_hr", "rsvqa_hr_phili"),
        host="zenodo",
        # big_vision rsvqa_hr.py docstring: "https://zenodo.org/records/6344367"
        record="6344367",
        revision="",
        licence="CC BY 4.0 (Zenodo record)",
        homepage="https://rsvqa.sylvainlobry.com/",
        # Zenodo's MD5s of this record: none known here, as for RSVQA-LR
        files=(
            File("USGS_split_test_questions.json", "RSVQA-HR/USGS_split_test_questions.json",
                 only=("rsvqa_hr",), checksum=NONE_KNOWN),
            File("USGS_split_test_answers.json", "RSVQA-HR/USGS_split_test_answers.json",
                 only=("rsvqa_hr",), checksum=NONE_KNOWN),
            File("USGS_split_test_phili_questions.json", "RSVQA-HR/USGS_split_test_phili_questions.json",
                 only=("rsvqa_hr_phili",), checksum=NONE_KNOWN),
            File("USGS_split_test_phili_answers.json", "RSVQA-HR/USGS_split_test_phili_answers.json",
                 only=("rsvqa_hr_phili",), checksum=NONE_KNOWN),
            # Data/<img_id>.tif, with .png copies beside them; GeoChat re-evaluation guides
            # unpack only `tar -xvf Images.tar --wildcards "Data/*.tif"` (10,659 files)
            File("Images.tar", "RSVQA-HR", kind="tar", top="Data", members=("Data/*.tif",), checksum=NONE_KNOWN),
        ),
        approx_size="about 14 GB, nearly all Images.tar (big_vision's docstring: 14G)",
    ),
    Source(
        name="vrsbench",
        title="VRSBench evaluation files and validation images (Li et al. 2024), Hugging Face",
        benchmarks=("vrsbench", "vrsbench_ref"),
        host="hub",
        record="xiang709/VRSBench",
        # the commit "Rename RSBench_EVAL_Cap.json to VRSBench_EVAL_Cap.json", whose tree page
        # (huggingface.co/datasets/xiang709/VRSBench/tree/907809047ad5ef23fffb8ac137aa1c6880f90bbb)
        # lists RSBench_EVAL_vqa.json, RSBench_EVAL_referring.json (v1.1) and Images_val.zip (v1.0)
        revision="907809047ad5ef23fffb8ac137aa1c6880f90bbb",
        licence="CC BY 4.0 on the dataset card and in the paper's appendix D (some copies of the card said CC BY-NC 4.0)",
        homepage="https://github.com/lx709/VRSBench",
        files=(
            # the names before the dataset's rename; the loader accepts both (vrsbench.py).
            # Plain git files, not LFS (the v1.0 commit be03677 adds them without a pointer), so
            # the Hub publishes no SHA-256 for them: none known; trusted on first use
            File("RSBench_EVAL_vqa.json", "VRSBench/RSBench_EVAL_vqa.json", only=("vrsbench",),
                 checksum=NONE_KNOWN),
            File("RSBench_EVAL_referring.json", "VRSBench/RSBench_EVAL_referring.json",
                 only=("vrsbench_ref",), checksum=NONE_KNOWN),
            # Images_val/<image_id>.png; LFS SHA-256: none known here (the v1.0 commit page
            # be03677 shows the other archives' oids, not this one's): read from the tree API
            File("Images_val.zip", "VRSBench", kind="zip", top="Images_val", checksum=NONE_KNOWN),
        ),
        approx_size="about 4 GB (Images_val.zip 3.98 GB, the JSON files 20 MB)",
        pin="a commit that holds every file the loaders read",
    ),
    Source(
        name="lhrs",
        title="LHRS-Bench (Muhtar et al. 2024), the authors' release on Hugging Face",
        benchmarks=("lhrs",),
        host="hub",
        record="PumpkinCat/LHRS_Data",
        # The folder's only commit is c60778e ("commit LHRS-Bench", 2024-07-09, the tree page
        # of huggingface.co/datasets/PumpkinCat/LHRS_Data/tree/main/LHRS-Bench); its full id
        # was not readable, so the revision is pinned at first use: the commit the Hub
        # resolves `main` to is written to the lock file and used from then on.
        revision="main",
        licence="MIT (dataset card)",
        homepage="https://github.com/NJU-LHRS/LHRS-Bot",
        # qa.json is an LFS file (259 kB, tree page): its SHA-256 is none known here, read from
        # the tree API at the pinned commit, as are the images'
        files=(File("LHRS-Bench/qa.json", "LHRS_Bench/qa.json", checksum=NONE_KNOWN),),
        listings=(Listing("LHRS-Bench/imgs_jpg", "LHRS_Bench/imgs_jpg"),),
        approx_size="about 100 MB (qa.json 259 kB and the JPEG images)",
        pin="pinned at first use (the lock file keeps the commit)",
    ),
)


def by_name() -> dict[str, Source]:
    return {s.name: s for s in SOURCES}


def for_benchmark(name: str) -> Source | None:
    return next((s for s in SOURCES if name in s.benchmarks), None)
