#!/usr/bin/env python3
"""Writes the packages' documentation from the sources that already hold it, so that nothing is written twice.

  gen_docs.py man1 CUDA_CRIU VERSION DOCDIR OUT
      cuda-criu.1.gz from the program's own manual (`cuda-criu help`, the command table of cli/commands.cpp)
  gen_docs.py conf README OPTIONS_CPP VERSION DOCDIR OUT_CONF OUT_MAN5
      the commented example /etc/criu/cuda_plugin.conf and cuda_plugin.conf.5.gz from the Options section of
      README.md; fails when its table and the keys the plugin parses (plugin/core/options.cpp) differ
  gen_docs.py changelog PACKAGE VERSION MAINTAINER TEXT OUT
      a package's changelog.gz: one entry, for this version

Dates come from SOURCE_DATE_EPOCH when it is set (reproducible builds), else from the clock; the gzip files
carry no time stamp.
"""
import gzip
import os
import re
import subprocess
import sys
import textwrap
import time

# Sections of the manual written as "LABEL  text" lines, the text going on indented below: .TP lists.
DEFINITION_SECTIONS = {"COMMANDS", "OPTIONS", "GLOBAL OPTIONS", "ENVIRONMENT", "EXIT STATUS"}


def build_time():
    return time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", time.time())))


def write_gzip(path, text):
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as f:
            f.write(text.encode())


def esc(text):
    """Text for roff: backslashes and hyphens escaped (\\- is the hyphen of options and commands)."""
    return text.replace("\\", "\\e").replace("-", "\\-")


def roff_lines(lines):
    """Lines as roff input lines: one beginning with a control character is protected."""
    return "".join(("\\&" if line[:1] in (".", "'") else "") + line + "\n" for line in lines)


def preformatted(lines):
    return ".PP\n.nf\n" + roff_lines(esc(line) for line in lines) + ".fi\n"


def split_sections(text):
    """[(TITLE, [body lines without the 4-column indent])] of one page of `cuda-criu help`."""
    sections = []
    for line in text.splitlines():
        if line and not line[0].isspace():
            sections.append((line, []))
        elif sections:
            sections[-1][1].append(line[4:] if line.startswith("    ") else line.strip())
    for _, body in sections:
        while body and not body[-1].strip():
            body.pop()
    return sections


def blocks(lines):
    """Runs of lines between blank lines."""
    block = []
    for line in lines + [""]:
        if line.strip():
            block.append(line)
        elif block:
            yield block
            block = []


def definitions(lines):
    """[(label, text)] of "LABEL  text" entries with their indented continuations, or None when the lines are
    not in that form."""
    entries = []
    for line in lines:
        if not line.strip():
            continue
        if not line[0].isspace():
            label, _, text = line.partition("  ")
            entries.append([label.strip(), [text.strip()] if text.strip() else []])
        elif entries:
            entries[-1][1].append(line.strip())
        else:
            return None
    for entry in entries:
        # A label as wide as the column of the text has one space after it ("criu-device-hooks CRIU 4.0 ...").
        if not entry[1] and " " in entry[0]:
            entry[0], _, text = entry[0].partition(" ")
            entry[1] = [text]
    if not entries or any(not text for _, text in entries):
        return None
    return [(label, " ".join(text)) for label, text in entries]


def is_prose(block):
    return all(not line[0].isspace() and "  " not in line for line in block)


def dedent(block):
    indent = min(len(line) - len(line.lstrip()) for line in block)
    return [line[indent:] for line in block]


def definition_list(entries):
    return "".join(".TP\n" + roff_lines(["\\fB" + esc(label) + "\\fR", esc(text)]) for label, text in entries)


def section_body(title, lines):
    """A section of the manual in roff: definition lists as .TP entries, prose filled, the rest (the synopsis,
    the examples, diagrams) as it is."""
    if title in DEFINITION_SECTIONS:
        entries = definitions(lines)
        if entries:
            return definition_list(entries)
    if title == "SYNOPSIS":  # a line each, wrapped where it is too long
        return ".PP\n" + "".join(roff_lines([esc(line.strip())]) + ".br\n" for line in lines if line.strip())
    out = ""
    for block in blocks(lines):
        if title == "EXAMPLES":
            out += preformatted(block)
        elif is_prose(block):
            out += ".PP\n" + roff_lines(esc(line) for line in block)
        elif (entries := definitions(dedent(block))) and len(entries) > 1:
            out += definition_list(entries)
        else:
            out += preformatted(block)
    return out


def run(cuda_criu, *args):
    return subprocess.run([cuda_criu, *args], check=True, capture_output=True, text=True).stdout


def man_header(name, section, version, kind):
    date = time.strftime("%Y-%m-%d", build_time())
    return f'.TH {esc(name.upper())} {section} {date} "cuda\\-criu {esc(version)}" "{kind}"\n'


def man1(cuda_criu, version, docdir, out):
    page = man_header("cuda-criu", 1, version, "User Commands")
    for title, body in split_sections(run(cuda_criu, "help")):
        if title == "SEE ALSO":
            continue
        page += f".SH {esc(title)}\n"
        if title == "NAME":
            name, _, summary = " ".join(body).partition(" - ")
            page += roff_lines([esc(name) + " \\- " + esc(summary)])
        else:
            page += section_body(title, body)
    # One section per command: its page, in the order of the overview.
    for entry in run(cuda_criu, "help", "--commands").splitlines():
        command = entry.split()[0]
        for title, body in split_sections(run(cuda_criu, "help", command)):
            if title == "NAME":
                summary = " ".join(body).partition(" - ")[2]
                page += f'.SH "CUDA\\-CRIU {esc(command.upper())}"\n'
                page += roff_lines([esc(summary[:1].upper() + summary[1:]) + "."])
            else:
                page += f".SS {esc(title)}\n" + section_body(title, body)
    page += ".SH SEE ALSO\n.BR cuda_plugin.conf (5),\n.BR criu (8);\n" + roff_lines(
        [esc(f"docs/cli.md and the other documents in {docdir}")])
    write_gzip(out, page)


def markdown_to_text(text):
    """Plain text of inline Markdown: links become their text, code and emphasis lose their marks."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return text.replace("**", "").replace("`", "")


def markdown_to_roff(text):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    parts = re.split(r"(`[^`]*`|\*\*[^*]*\*\*)", text)
    return "".join("\\fB" + esc(p[1:-1] if p[0] == "`" else p[2:-2]) + "\\fR" if p[:1] in ("`", "*") else esc(p)
                   for p in parts)


def readme_options(readme):
    """(intro paragraph, [(variable, key, default, meaning)]) of the Options section of README.md (a key's other
    spellings, such as cuda.device-map, are left out: every key has that one)."""
    lines = open(readme, encoding="utf-8").read().splitlines()
    start = lines.index("## Options") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("## "))
    section = lines[start:end]
    intro = " ".join(line for line in section if line.strip() and not line.startswith("|"))
    rows = []
    for line in section:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] in ("variable", "") or set(cells[0]) <= set("-: "):
            continue
        if len(cells) != 4:
            sys.exit(f"{readme}: an Options row without 4 cells: {line}")
        rows.append((cells[0].strip("`"), re.findall(r"`([^`]*)`", cells[1])[0], cells[2], cells[3]))
    return intro, rows


def check_keys(rows, options_cpp):
    """README's table lists exactly the keys the plugin parses, each with its variable."""
    source = open(options_cpp, encoding="utf-8").read()
    table = source[source.index("const Key kKeys[]"):]
    table = table[:table.index("\n};")]
    parsed = re.findall(r'^\t\{"([a-z-]+)",', table, re.M)
    listed = [key for _, key, _, _ in rows]
    if sorted(parsed) != sorted(listed):
        sys.exit(f"README.md's Options table ({', '.join(listed)}) and the keys of {options_cpp} "
                 f"({', '.join(parsed)}) differ")
    for variable, key, _, _ in rows:
        if variable != "CUDA_CRIU_" + key.upper().replace("-", "_"):
            sys.exit(f"README.md: {variable} is not the variable of {key}")


def example_value(default):
    """The value shown in the example: the default, or nothing where the default is not a value."""
    return "" if not default or default.startswith("(") else default


def conf_example(intro, rows, version):
    wrap = textwrap.TextWrapper(width=100, initial_indent="# ", subsequent_indent="# ", break_long_words=False,
                                break_on_hyphens=False)
    out = ["# /etc/criu/cuda_plugin.conf: the options of cuda_plugin.so, the CUDA plugin of CRIU",
           f"# (cuda-criu {version}). Every line here is a comment: the plugin runs with its defaults.",
           "#"]
    out += wrap.wrap(markdown_to_text(intro)) + ["#"]
    out += wrap.wrap("Each option is a key=value line; '#' starts a comment. Remove the '#' in front of a "
                     "key to set it. See cuda_plugin.conf(5).")
    for variable, key, default, meaning in rows:
        out += ["#"] + wrap.wrap(markdown_to_text(meaning))
        out += wrap.wrap(f"Default: {markdown_to_text(default) or 'none'}. Environment: {variable}.")
        out.append(f"#{key}={example_value(default)}")
    return "\n".join(out) + "\n"


def man5(intro, rows, version, docdir):
    page = man_header("cuda_plugin.conf", 5, version, "File Formats")
    page += ".SH NAME\n" + roff_lines([esc("cuda_plugin.conf") + " \\- " +
                                        esc("options of cuda_plugin.so, the CUDA checkpoint/restore plugin of CRIU")])
    page += ".SH SYNOPSIS\n" + roff_lines([esc("/etc/criu/cuda_plugin.conf")])
    page += ".SH DESCRIPTION\n" + roff_lines([markdown_to_roff(intro)])
    page += ".PP\n" + roff_lines([esc(
        "Each option is a key=value line (spaces around the key and the value are ignored); '#' starts a "
        "comment; a key may also be written cuda.KEY. An unknown key or a bad value makes the plugin refuse "
        "to work, naming the file, the line and the reason, so that criu dump and criu restore fail.")])
    page += ".SH OPTIONS\n"
    for variable, key, default, meaning in rows:
        label = "\\fB" + esc(key) + "\\fR=\\fIVALUE\\fR"
        facts = (esc(f"Default: {markdown_to_text(default) or 'none'}. Environment: ") + "\\fB" + esc(variable) +
                 "\\fR.")
        page += ".TP\n" + roff_lines([label, markdown_to_roff(meaning) + "."]) + ".br\n" + roff_lines([facts])
    page += ".SH FILES\n.TP\n" + roff_lines([esc("/etc/criu/cuda_plugin.conf"),
                                             esc("the file read by default; CUDA_CRIU_CONFIG=PATH names another")])
    page += ".SH SEE ALSO\n.BR cuda\\-criu (1),\n.BR criu (8);\n"
    page += roff_lines([esc(f"README.md and docs/ in {docdir}")])
    return page


def changelog(package, version, maintainer, text):
    date = time.strftime("%a, %d %b %Y %H:%M:%S +0000", build_time())
    return f"{package} ({version}) unstable; urgency=medium\n\n  * {text}\n\n -- {maintainer}  {date}\n"


def main(argv):
    if len(argv) == 6 and argv[1] == "man1":
        man1(*argv[2:])
    elif len(argv) == 8 and argv[1] == "conf":
        readme, options_cpp, version, docdir, out_conf, out_man5 = argv[2:]
        intro, rows = readme_options(readme)
        check_keys(rows, options_cpp)
        with open(out_conf, "w", encoding="utf-8") as f:
            f.write(conf_example(intro, rows, version))
        write_gzip(out_man5, man5(intro, rows, version, docdir))
    elif len(argv) == 7 and argv[1] == "changelog":
        package, version, maintainer, text, out = argv[2:]
        write_gzip(out, changelog(package, version, maintainer, text))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
