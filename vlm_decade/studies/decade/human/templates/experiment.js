/* The human experiment of a vlm-decade Study A, on jsPsych 8 (docs/human.md).
 *
 * What to show comes from index.html's embedded design (the JSON block "vd-design", written by
 * `vlm-decade human design`: the design participants, the example trial, the rating scale and the
 * completion code) and from trials/<design participant>.json (that participant's trials and the texts
 * of the descriptions their ranking trials show), fetched once the participant is known. Where the data goes
 * depends on where the page runs:
 *   - served by `vlm-decade human serve`: every trial is posted to data/<participant> as it ends, and
 *     a reload asks the server what it holds and skips the finished trials;
 *   - under JATOS (window.jatos): the whole of jsPsych's data is submitted at the end;
 *   - on any other host: jsPsych saves its JSON to the participant's disk at the end.
 */
(function () {
  "use strict";

  const DESIGN = JSON.parse(document.getElementById("vd-design").textContent);
  const TEXTS = Object.assign({}, DESIGN.example_texts); // and the participant's, once fetched
  const URL_IDS = ["PROLIFIC_PID", "participant", "workerId"];
  const DESIGN_KINDS = ["describe", "rank", "rate", "attention"];
  const RETRY_MS = 1000;
  const KEEPALIVE_BYTES = 60000; // under the 64 KB browsers allow a keepalive request

  const INSTRUCTIONS = {
    describe: [
      "<h2>Describing pictures</h2><p>You will see a series of pictures, one at a time.</p>" +
        "<p>For each picture, describe the scene: what is happening in it, as you would tell someone who cannot see it.</p>",
      "<p>Describe the <b>semantic content</b> of the scene: who or what is there, what they are doing, and how they " +
        "relate to each other. One or two full sentences are enough.</p>" +
        "<p>Some pictures have a part covered; describe what you can see.</p>",
      "<h3>Examples</h3><p>A good description: <i>“Two men argue across a kitchen table while a woman holds a crying " +
        "child back from them.”</i></p><p>Too short: <i>“People in a kitchen.”</i></p>" +
        "<p>Now try one example picture. Some pictures check that you read the question: do what they ask.</p>",
    ],
    rank: [
      "<h2>Choosing the best description</h2><p>You will see a picture and several descriptions of it, written by " +
        "other people.</p>",
      "<p>Choose the description that <b>best matches the semantic content</b> of the picture: what is happening, " +
        "who is doing what. Some descriptions belong to other pictures; do not choose those.</p>",
      "<p>Click the description you choose. Now try one example.</p>",
    ],
    rate: [
      "<h2>Rating similarity</h2><p>You will see a reference description of a picture and another description of " +
        "the same picture.</p>",
      "<p>Rate how <b>similar in meaning</b> the second description is to the reference, on the slider: the left end " +
        "is not similar at all, the right end is the same meaning.</p>",
      "<p>Move the slider, then continue. Now try one example.</p>",
    ],
  };

  function escapeHtml(text) {
    return String(text == null ? "" : text).replace(/[&<>"']/g, (c) => ({
      "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
    })[c]);
  }

  function imageHtml(row) {
    return '<img class="vd-image" alt="" src="images/' + encodeURIComponent(row.image) + '">';
  }

  function participantId(jsPsych) {
    if (window.jatos && window.jatos.workerId) return String(window.jatos.workerId);
    for (const name of URL_IDS) {
      const value = jsPsych.data.getURLVariable(name);
      if (value) return value;
    }
    // No id in the address: one made up in this browser and kept, so a reload is the same participant.
    let kept = window.localStorage.getItem("vd-participant");
    if (!kept) {
      const bytes = new Uint8Array(8);
      window.crypto.getRandomValues(bytes);
      kept = "anon-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
      window.localStorage.setItem("vd-participant", kept);
    }
    return kept;
  }

  // The design participant a static host gives: `?p=`, else one picked by a hash of the id.
  function pickedDesignParticipant(jsPsych, participant) {
    const asked = jsPsych.data.getURLVariable("p");
    if (asked && DESIGN.participants.includes(asked)) return asked;
    const names = DESIGN.participants;
    let hash = 2166136261;
    for (const c of participant) hash = Math.imul(hash ^ c.charCodeAt(0), 16777619) >>> 0;
    return names[hash % names.length];
  }

  /* The server of `vlm-decade human serve`: what it holds for this participant, or null where the page
   * is not served by it (a static host answers 404, a file has no server). */
  async function askServer(participant, asked) {
    try {
      const query = asked ? "?p=" + encodeURIComponent(asked) : "";
      const answer = await fetch("data/" + encodeURIComponent(participant) + query, { cache: "no-store" });
      if (!answer.ok) return null;
      const held = await answer.json();
      return held && held.server === "vlm-decade" ? held : null;
    } catch (error) {
      return null;
    }
  }

  // Posts records in order; one that fails is sent again (the server keeps a trial once).
  function poster(participant) {
    const queue = [];
    let busy = false;
    async function drain() {
      if (busy) return;
      busy = true;
      while (queue.length) {
        try {
          // keepalive: a post under way when the participant closes the page (the end record, sent
          // as the completion code shows) still reaches the server; such a body may be 64 KB at most.
          let count = Math.min(20, queue.length);
          let body = JSON.stringify(queue.slice(0, count));
          const bytes = (text) => new TextEncoder().encode(text).length;
          while (count > 1 && bytes(body) > KEEPALIVE_BYTES) {
            count = Math.ceil(count / 2);
            body = JSON.stringify(queue.slice(0, count));
          }
          const answer = await fetch("data/" + encodeURIComponent(participant), {
            method: "POST",
            headers: { "Content-Type": "application/json" },
            body: body,
            keepalive: bytes(body) <= KEEPALIVE_BYTES,
          });
          if (!answer.ok) throw new Error("HTTP " + answer.status);
          const sent = (await answer.json()).received;
          queue.splice(0, sent);
        } catch (error) {
          await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
        }
      }
      busy = false;
      document.body.dataset.vdPending = "0";
    }
    return (record) => {
      queue.push(record);
      document.body.dataset.vdPending = String(queue.length);
      drain();
    };
  }

  function attentionPassed(row, record) {
    if (row.kind !== "attention") return undefined;
    if (DESIGN.experiment === "rank") return record.chosen === row.answer;
    if (DESIGN.experiment === "rate") return Number(record.rating) === Number(row.answer);
    const words = String(record.text || "").toLowerCase().match(/[\p{L}\p{N}]+/gu) || [];
    return words.includes(String(row.answer).toLowerCase());
  }

  function trialData(row, kind) {
    return {
      vd_trial: kind === "example" ? undefined : row.trial, // the example is no trial of the design
      vd_kind: kind,
      image_id: row.image_id,
      condition: row.condition,
      options: row.options.length ? row.options : undefined,
      subject: row.subject || undefined,
    };
  }

  function describeTrial(row, kind) {
    // An attention check's text says what to type.
    const asked = row.kind === "attention" ? "<p class='vd-check'>" + escapeHtml(row.text) + "</p>" : "";
    return {
      type: jsPsychSurveyText,
      preamble: imageHtml(row) + asked,
      questions: [{ prompt: "Describe the scene.", name: "description", rows: 4, columns: 70, required: true }],
      button_label: "Continue",
      data: trialData(row, kind),
      on_finish: (data) => {
        data.text = data.response.description;
        data.attention_passed = attentionPassed(row, data);
      },
    };
  }

  function rankTrial(row, kind) {
    // An attention check is one of the options, whose text says to choose it.
    return {
      type: jsPsychHtmlButtonResponse,
      stimulus: imageHtml(row) + "<p>Which description best matches the scene?</p>",
      choices: row.options.map((id) => TEXTS[id]),
      button_layout: "flex",
      button_html: (choice, index) =>
        '<button class="jspsych-btn vd-option" data-option="' + escapeHtml(row.options[index]) + '">' +
        escapeHtml(choice) + "</button>",
      data: trialData(row, kind),
      on_finish: (data) => {
        data.chosen = row.options[data.response];
        data.attention_passed = attentionPassed(row, data);
      },
    };
  }

  function rateTrial(row, kind) {
    const scale = DESIGN.scale;
    // An attention check's description says what to rate it.
    return {
      type: jsPsychHtmlSliderResponse,
      stimulus:
        imageHtml(row) + "<p><b>Reference:</b> " + escapeHtml(row.gold) + "</p><p><b>Description:</b> " +
        escapeHtml(row.text) + "</p>",
      min: scale.min,
      max: scale.max,
      step: scale.step,
      slider_start: scale.min,
      labels: scale.labels,
      require_movement: true,
      prompt: "<p>How similar in meaning is the description to the reference?</p>",
      button_label: "Continue",
      data: trialData(row, kind),
      on_finish: (data) => {
        data.rating = Number(data.response);
        data.attention_passed = attentionPassed(row, data);
      },
    };
  }

  const TRIALS = { describe: describeTrial, rank: rankTrial, rate: rateTrial };

  function timeline(rows, heldKinds) {
    const make = TRIALS[DESIGN.experiment];
    const steps = [
      { type: jsPsychPreload, images: rows.map((row) => "images/" + row.image), data: { vd_kind: "instructions" } },
    ];
    if (!heldKinds.has("example") && rows.length) {
      steps.push({
        type: jsPsychInstructions,
        pages: INSTRUCTIONS[DESIGN.experiment],
        show_clickable_nav: true,
        button_label_next: "Next",
        button_label_previous: "Back",
        data: { vd_kind: "instructions" },
      });
      const example = Object.assign({}, DESIGN.example, { kind: "example" });
      steps.push(make(example, "example"));
      steps.push({
        type: jsPsychHtmlButtonResponse,
        stimulus: "<p>That was the example. The experiment starts now.</p>",
        choices: ["Start"],
        data: { vd_kind: "instructions" },
      });
    }
    for (const row of rows) steps.push(make(row, row.kind));
    return steps;
  }

  function showEnd(jsPsych) {
    jsPsych.getDisplayElement().innerHTML =
      "<div class='vd-end'><h2>Thank you</h2><p>Your completion code:</p><p id='vd-completion-code'>" +
      escapeHtml(DESIGN.completion_code) + "</p></div>";
  }

  async function start() {
    let post = null;
    const jsPsych = initJsPsych({
      on_data_update: (data) => {
        if (post) post(data);
      },
      on_finish: () => {
        const end = {
          trial_type: "end",
          trial_index: jsPsych.data.get().count(),
          time_elapsed: jsPsych.getTotalTime(),
          vd_kind: "end",
          completion_code: DESIGN.completion_code,
        };
        jsPsych.data.get().push(Object.assign({}, common, end));
        if (post) post(Object.assign({}, common, end));
        else if (window.jatos) window.jatos.submitResultData(jsPsych.data.get().json());
        else jsPsych.data.get().localSave("json", "vd-" + common.vd_participant + ".json");
        showEnd(jsPsych);
      },
    });
    const participant = participantId(jsPsych);
    const held = window.jatos ? null : await askServer(participant, jsPsych.data.getURLVariable("p"));
    const designParticipant = held ? held.design_participant : pickedDesignParticipant(jsPsych, participant);
    const common = {
      vd_experiment: DESIGN.experiment_id,
      vd_participant: participant,
      vd_design_participant: designParticipant,
    };
    jsPsych.data.addProperties(common);
    const records = held ? held.records : [];
    if (held) post = poster(participant);
    if (records.some((record) => record.vd_kind === "end")) {
      showEnd(jsPsych);
      return;
    }
    const done = new Set(
      records.filter((record) => DESIGN_KINDS.includes(record.vd_kind)).map((record) => record.vd_trial),
    );
    const heldKinds = new Set(records.map((record) => record.vd_kind));
    let mine;
    try {
      const answer = await fetch("trials/" + encodeURIComponent(designParticipant) + ".json");
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      mine = await answer.json();
    } catch (error) {
      jsPsych.getDisplayElement().innerHTML =
        "<p>The experiment could not load its trials (" + escapeHtml(error.message) + "): open it from a web server.</p>";
      return;
    }
    Object.assign(TEXTS, mine.texts);
    const rows = mine.trials.filter((row) => !done.has(row.trial));
    await jsPsych.run(timeline(rows, heldKinds));
  }

  if (window.jatos) window.jatos.onLoad(start);
  else start();
})();
